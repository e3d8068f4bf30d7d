"""The HBM keep where it runs (served topology): asked only where it pays, so the
holds do not cost against the same run with holds off (issue 24 (b))."""

from __future__ import annotations

import asyncio

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


def test_no_keep_where_the_sidecar_serves_the_return() -> None:
    """Agent sessions (~25-block prompts) behind an engine of 200 blocks and a DRAM
    tier of 400 that serves their returns: a keep would gain a DRAM load (~3% of the
    prefill) and pin the engine's memory, so none is asked and the run with holds is
    the run without. On the old code every tool call was held for the bound (147
    holds made)."""
    reqs = agents(40)
    off = served(reqs, 200, 400, 0)
    on = served(reqs, 200, 400, 60)
    assert on.holds_made == 0, on.holds_made
    assert on.hit_blocks == off.hit_blocks
    assert on.after_tool_ttft_p50_s == off.after_tool_ttft_p50_s
    assert on.prefill_s_saved == off.prefill_s_saved


def test_keeps_are_asked_where_the_sidecar_has_no_room() -> None:
    """200 such sessions in 10 minutes, an engine of 100 blocks, a sidecar of 5 (no room
    for a prompt): the keeps are learned to pay, are asked, and cut what is recomputed
    (more hits and prefill saved than with holds off: 29,147 blocks against 28,949). A
    rule that never keeps would fail here. The after-tool TTFT p50 moves by
    milliseconds at most here (1.4738 s either way; 1.4720 s with holds when the bets
    placed the sidecar's five blocks from the start): it must not be worse."""
    reqs = agents(200)
    off = served(reqs, 100, 5, 0)
    on = served(reqs, 100, 5, 30)
    assert on.holds_made > 0
    assert on.hit_blocks > off.hit_blocks, (on.hit_rate, off.hit_rate)
    assert on.prefill_s_saved > off.prefill_s_saved
    assert on.after_tool_ttft_p50_s <= off.after_tool_ttft_p50_s, (
        on.after_tool_ttft_p50_s, off.after_tool_ttft_p50_s)


def test_no_keep_where_the_engine_keeps_the_blocks_itself() -> None:
    """40 sessions, engine 200 blocks, sidecar 100: the engine's free queue serves 65% of
    lookups by itself, so a keep gains little over no keep; but the sidecar, short of
    room, does not serve many returns. Blind to the engine's own hit, the ledger judged
    those keeps to pay and they cost a little (58 holds: hit rate 70.77% against
    70.92%); with the lookup carrying it (``num_computed_tokens``) the unasked keeps
    show the engine kept those prefixes itself, none is asked, and the run is the
    run with holds off."""
    reqs = agents(40)
    off = served(reqs, 200, 100, 0)
    on = served(reqs, 200, 100, 60)
    assert on.hit_blocks >= off.hit_blocks
    assert on.after_tool_ttft_p50_s <= off.after_tool_ttft_p50_s
