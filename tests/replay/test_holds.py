"""The HBM keep where it runs (served topology): asked only where it pays, so the
holds never cost against the same run with holds off (issue 24 (b))."""

from __future__ import annotations

import asyncio

import pytest
from kvstore.policies.cost import CostModel

from kvstore.replay.driver import TierBudget
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.served import EngineModel, ServedConfig, ServedResult, replay_served
from kvstore.replay.trace import Request


def agents(sessions: int) -> list[Request]:
    return generate("agent", GenConfig(sessions=sessions, duration_s=600.0, seed=0, scale=0.1))


def served(reqs: list[Request], engine: int, dram: int, hold: int) -> ServedResult:
    cfg = ServedConfig(engine, (TierBudget("dram", dram),), hold, model=EngineModel())
    return asyncio.run(replay_served(reqs, "adaptive", cfg, CostModel()))


@pytest.mark.parametrize("dram", [100, 400])
def test_no_keep_where_the_sidecar_serves_the_return(dram: int) -> None:
    """Agent sessions (~25-block prompts) behind an engine of 200 blocks and a DRAM
    tier that serves their returns: a keep would gain a DRAM load (~3% of the
    prefill) and pin the engine's memory, so (past the cold start) hardly any is
    asked and the run with holds is no worse than the run without. On the old code
    every tool call was held for the bound (147 / 163 holds made; at DRAM 100 the
    after-tool TTFT p50 rose 2%)."""
    reqs = agents(40)
    off = served(reqs, 200, dram, 0)
    on = served(reqs, 200, dram, 60)
    assert on.holds_made <= len(reqs) // 100, on.holds_made  # the cold start's
    assert on.hit_blocks >= off.hit_blocks
    assert on.after_tool_ttft_p50_s <= off.after_tool_ttft_p50_s
    assert on.prefill_s_saved >= off.prefill_s_saved


def test_keeps_where_the_sidecar_has_no_room_pay() -> None:
    """The same sessions, five times as many, with a sidecar of 10 blocks (no room for
    a prompt): the keeps are learned to pay and cut what is recomputed (more hits,
    more prefill saved, a lower after-tool TTFT p50 than with holds off). On the old
    code (every tool call held) the after-tool p50 rose against holds off."""
    reqs = agents(200)
    off = served(reqs, 200, 10, 0)
    on = served(reqs, 200, 10, 60)
    assert on.holds_made > 0
    assert on.hit_blocks > off.hit_blocks, (on.hit_rate, off.hit_rate)
    assert on.prefill_s_saved > off.prefill_s_saved
    assert on.after_tool_ttft_p50_s < off.after_tool_ttft_p50_s, (
        on.after_tool_ttft_p50_s, off.after_tool_ttft_p50_s)
