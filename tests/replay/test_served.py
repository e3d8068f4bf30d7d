"""The served topology: vLLM's own prefix cache in front, the sidecar behind."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from kvstore.policies.base import Plan, RequestInfo, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.lru import LRUPolicy

from kvstore.replay.cli import main
from kvstore.replay.driver import TierBudget
from kvstore.replay.engine_cache import EngineCache
from kvstore.replay.fleet import FleetResult, replay_fleet
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.served import (
    EngineModel,
    ServedConfig,
    ServedResult,
    replay_served,
    sidecar_alone,
)
from kvstore.replay.trace import After, Request, dump_trace

INSTANT = EngineModel.instant()


class Refuser(LRUPolicy):
    """Admits nothing to the sidecar, records every request, keeps tool-call turns 5 s."""

    name = "refuser"
    seen: list[RequestInfo] = []

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        Refuser.seen = []

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        Refuser.seen.append(req)
        return Plan({}, keep_s=5.0 if req.then == "tool_call" else 0.0)


@pytest.fixture
def refuser(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstore import policies

    monkeypatch.setitem(policies._REGISTRY, "refuser",  # type: ignore[attr-defined]
                        f"{__name__}:Refuser")


def req(t_ms: int, ids: Sequence[int], out: int = 0, **kw: object) -> Request:
    return Request(t_ms, len(ids) * 512, out, tuple(ids), **kw)  # type: ignore[arg-type]


def full_blocks_only(reqs: Sequence[Request]) -> list[Request]:
    """The requests without the id of their partial last block (the length is kept)."""
    return [dataclasses.replace(r, hash_ids=r.hash_ids[:r.input_length // 512]) for r in reqs]


def fleet_loop(reqs: Sequence[Request], policy: str, tiers: Sequence[TierBudget]
               ) -> FleetResult:
    """The fleet replay (``--workers``) with one worker: the sidecar alone, untimed, over
    ``tiers``."""
    return replay_fleet(reqs, 1, "load", policy, sidecar_alone(tiers), CostModel())


def served(reqs: Sequence[Request], policy: str, engine: int, dram: int, hold: int = 0,
           model: EngineModel = INSTANT, **kw: object) -> ServedResult:
    cfg = ServedConfig(engine, (TierBudget("dram", dram),), hold, model=model,
                       **kw)  # type: ignore[arg-type]
    return asyncio.run(replay_served(reqs, policy, cfg, CostModel()))


def test_engine_cache_evicts_freed_blocks_lru_tail_first() -> None:
    c = EngineCache(4)
    a = c.acquire([1, 2, 3])
    assert c.match([1, 2, 3, 9]) == 3
    c.release(a)
    # 3 is freed first (tail first), so it is evicted first; pinned blocks never are.
    b = c.acquire([7, 8])
    assert c.match([1, 2, 3]) == 2 and 7 in c and 8 in c
    c.release(b)
    c.acquire([1, 5, 6])  # 1 reused; 5 and 6 evict 2, then 8 (b's tail, freed before 7)
    assert 2 not in c and 8 not in c and 7 in c and 1 in c
    assert EngineCache(2).acquire([1, 2, 3]) == (1, 2)  # what finds no room is not cached


def test_engine_cache_partial_block_takes_a_slot_and_frees_to_an_empty_one() -> None:
    # vLLM allocates a prompt's partial last block like any other; it has no hash, and
    # when freed it is reused first (evicting nothing).
    c = EngineCache(4)
    a = c.acquire([1, 2, 3], partial=True)
    assert len(a) == 4 and len(c) == 4 and c.room() == 0
    assert c.acquire([7]) == ()  # every slot pinned, the partial one too
    c.release(a)
    assert len(c) == 3 and c.room() == 4
    b = c.acquire([7], partial=True)  # the empty slot, then 3 (the tail) is evicted
    assert c.match([1, 2, 3]) == 2 and 7 in c
    c.release(b)
    assert c.match([1, 2]) == 2 and c.room() == 4


def test_a_partial_last_block_is_never_saved_or_hit() -> None:
    # Block 3 is partial in the first request (2 x 512 + 100 tokens) and full in the
    # second: the connector never looks up or saves a block without a hash, so the
    # second request finds 1 and 2 alone. A prompt of whole blocks hits all but its last
    # block (the engine computes the last token).
    reqs = [Request(0, 1124, 0, (1, 2, 3), session_id="s"),
            Request(1000, 1636, 0, (1, 2, 3, 4), session_id="s")]
    assert served(reqs, "lru", engine=0, dram=20).hit_blocks == 2
    assert served(reqs, "lru", engine=8, dram=20).hits_by_tier["engine"] * 7 == \
        pytest.approx(2)
    whole = [req(0, [1, 2, 3], session_id="s"), req(1000, [1, 2, 3], session_id="s")]
    for engine in (0, 8):
        assert served(whole, "lru", engine=engine, dram=20).hit_blocks == 2


def test_computed_block_is_an_engine_hit_without_the_policy(refuser: None) -> None:
    # The sidecar admits nothing, so every hit is the engine's own cache.
    reqs = [req(0, [1, 2, 3], session_id="s"), req(1000, [1, 2, 3, 4], session_id="s"),
            req(2000, [9, 10, 11, 12], session_id="t"), req(3000, [1, 2, 5], session_id="s")]
    r = served(reqs, "refuser", engine=6, dram=10)
    # second request: 3 engine hits; the third evicts 3, 4 (tail first), 2 survives
    assert r.hits_by_tier["engine"] * r.lookups == pytest.approx(3 + 2)
    assert r.hits_by_tier["dram"] == 0.0
    off = served(reqs, "refuser", engine=0, dram=10)
    assert off.hit_rate == 0.0


def test_lookups_carry_then_and_tool(refuser: None) -> None:
    reqs = [req(0, [1], session_id="s", after=After("tool_call", "bash")),
            req(1000, [1, 2], session_id="s", after=After("user")),
            req(2000, [1, 2, 3], session_id="s", after=After("end"))]
    served(reqs, "refuser", engine=4, dram=4)
    assert [(r.then, r.tool) for r in Refuser.seen] == [
        ("tool_call", "bash"), ("turn_end", ""), ("turn_end", "")]  # the end is not known
    served(reqs, "refuser", engine=4, dram=4, trust_end=True)
    assert Refuser.seen[-1].then == "session_end"
    served(reqs, "refuser", engine=4, dram=4, send_then=False)
    assert {r.then for r in Refuser.seen} == {""}
    # A client that says nothing: nothing is sent (the connector's default is no news).
    served([req(0, [1], session_id="s")], "refuser", engine=4, dram=4)
    assert [r.then for r in Refuser.seen] == [""]


def test_decode_blocks_are_saved_and_hit_by_the_next_turn() -> None:
    # 2 prompt blocks, 1024 output tokens: two decode blocks, sent back in the next prompt.
    reqs = [req(0, [1, 2], out=1024, session_id="s"),
            req(60_000, [1, 2, 3, 4, 5], session_id="s")]
    with_decode = served(reqs, "lru", engine=0, dram=20)
    assert with_decode.decode_blocks_saved == 2
    assert with_decode.hit_blocks == 4  # 1, 2 and the decode blocks 3, 4
    without = served(reqs, "lru", engine=0, dram=20, decode_saves=False)
    assert without.decode_blocks_saved == 0 and without.hit_blocks == 2
    # In the engine's own cache too (the request's blocks grow while it decodes).
    assert served(reqs, "lru", engine=8, dram=20).hits_by_tier["engine"] * 7 == pytest.approx(4)


def test_holds_keep_a_tool_call_turn_in_the_engine(refuser: None) -> None:
    # Engine of 4 blocks. A1 (tool call) finishes at 0; B1 needs 3 blocks at 1 s: with
    # no hold it evicts A1's tail (2); with A1 held it finds one free slot... none: A1
    # pins 2, B1 caches 3, 4 and computes 5 uncached. A2 at 2 s: 1 engine hit, or 2.
    reqs = [req(0, [1, 2], session_id="a", after=After("tool_call", "bash")),
            req(1000, [3, 4, 5], session_id="b", after=After("user")),
            req(2000, [1, 2, 6], session_id="a", after=After("user"))]
    off = served(reqs, "refuser", engine=4, dram=4, hold=0)
    on = served(reqs, "refuser", engine=4, dram=4, hold=4)
    assert off.hit_blocks == 1 and off.holds_made == 0
    assert on.hit_blocks == 2 and on.holds_made == 1
    small = served(reqs, "refuser", engine=4, dram=4, hold=1)  # 2 blocks > budget 1
    assert small.hit_blocks == 1 and small.holds_refused == 1


@pytest.mark.parametrize("policy", ["lru", "ttl", "workload"])
def test_engine_blocks_0_is_the_single_tier_replay(policy: str) -> None:
    # The served loop with the engine cache off and what it adds neutralised (no time,
    # no decode saves, the old hints) is exactly the untimed single-tier loop (the one
    # the tables before the served topology used; the fleet replay's per worker with
    # sidecar_alone), on requests whose trace blocks are all full: the served replay, as vLLM, never
    # looks up or saves a partial last block (the untimed loop stores it like the others).
    reqs = full_blocks_only(generate("agent", GenConfig(sessions=25, duration_s=600.0,
                                                        seed=3, scale=0.05)))
    for cap in (20, 80):
        old = fleet_loop(reqs, policy, [TierBudget("dram", cap)])
        new = served(reqs, policy, engine=0, dram=cap, decode_saves=False, trust_end=True,
                     send_then=False)
        assert new.hit_blocks == old.hit_blocks and new.lookups == old.lookups
        assert new.hits_by_tier["dram"] == pytest.approx(old.hit_rate_by_tier["dram"])
        assert new.prefill_s_saved == pytest.approx(old.prefill_s_saved)


def test_time_model_overlaps_requests_and_prices_loads() -> None:
    # Two requests arrive together; each takes 1,024 / 1,000 tokens/s = 1.024 s of prefill
    # plus one token: both run at once (TTFT the same), a third waits for a slot.
    reqs = [req(0, [1, 2]), req(0, [3, 4]), req(0, [5, 6])]
    model = EngineModel(1000.0, 0.01, max_running=2)
    r = served(reqs, "lru", engine=0, dram=10, model=model)
    assert r.ttft_p50_s == pytest.approx(1.024 + 0.01)
    assert r.ttft_p99_s == pytest.approx(2 * 1.024 + 0.01)  # queued behind the first two
    # A DRAM hit is loaded at the tier's bandwidth, not computed: both full blocks (the
    # 1,025th token is computed; with 1,024 tokens only one block could be a hit).
    again = [Request(0, 1025, 0, (1, 2), session_id="s"),
             Request(10_000, 1025, 0, (1, 2), session_id="s")]
    r = served(again, "lru", engine=0, dram=10, model=model)
    load = 2 * CostModel().block_bytes / 20e9
    assert sorted([r.ttft_p50_s, r.ttft_p99_s]) == pytest.approx([load + 0.011, 1.035])
    aligned = served([req(0, [1, 2], session_id="s"), req(10_000, [1, 2], session_id="s")],
                     "lru", engine=0, dram=10, model=model)
    assert aligned.hit_blocks == 1


def test_mover_transfers_take_time() -> None:
    # DRAM over disk: each write-back to disk takes block_bytes / 3 GB/s (~9.8 ms), one
    # after the other; until it completes the block is in DRAM only.
    from kvstore.engine.blocks import NewBlock
    from kvstore.replay.driver import NAMESPACE, VirtualClock
    from kvstore.replay.served import build_sidecar

    cost = CostModel()
    clock = VirtualClock()
    engine, mover = build_sidecar("lru", [TierBudget("dram", 4), TierBudget("disk", 8)], cost,
                                  clock, timed=True, hold_max_s=0.0)
    blocks = [NewBlock(bytes([i]) * 8, bytes([i - 1]) * 8 if i > 1 else None, (), b"\0", 512)
              for i in (1, 2)]
    asyncio.run(engine.put(NAMESPACE, blocks, "s"))
    each = cost.block_bytes / 3e9

    def on_disk() -> int:
        return sum("disk" in e.tiers for e in (engine.index.blocks_of(NAMESPACE).values()))

    assert mover.pending == 2 and on_disk() == 0
    assert asyncio.run(mover.run_until(0.5 * each)) == 0
    assert asyncio.run(mover.run_until(1.5 * each)) == 1 and on_disk() == 1
    assert asyncio.run(mover.run_until(2.0 * each)) == 1 and on_disk() == 2
    assert mover.busy_s == pytest.approx(2 * each)


def test_cli_served_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    dump_trace(generate("agent", GenConfig(sessions=20, duration_s=300.0, seed=1, scale=0.05)),
               trace)
    out = tmp_path / "r.json"
    assert main(["replay", str(trace), "--policy", "lru", "--policy", "workload",
                 "--engine-blocks", "10", "--dram-blocks", "20,40", "--belady",
                 "--json", str(out), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert [(r["policy"], r["tiers"]["dram"]) for r in rows] == [
        ("lru", 20), ("workload", 20), ("lru", 40), ("workload", 40)]
    for r in rows:
        for k in ("policy", "hit_rate", "prefill_s_saved", "hits_by_tier", "ttft_p50_s",
                  "ttft_p99_s", "after_tool_ttft_p50_s", "engine_blocks", "tiers"):
            assert k in r, k
        assert set(r["hits_by_tier"]) == {"engine", "dram", "disk", "redis"}
        assert sum(r["hits_by_tier"].values()) == pytest.approx(r["hit_rate"])
        assert r["engine_blocks"] == 10 and r["hold_budget_blocks"] == 2
    assert set(doc["belady"]) == {"20", "40"}
    assert "from engine" in capsys.readouterr().out


def test_cli_hbm_blocks_points_at_engine_blocks(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    dump_trace([req(0, [1])], trace)
    assert main(["replay", str(trace), "--hbm-blocks", "500"]) == 2
    err = capsys.readouterr().err
    assert "--engine-blocks" in err and "--dram-blocks" in err
    assert main(["replay", str(trace), "--hbm-blocks", "0", "--dram-blocks", "4"]) == 0
    assert main(["replay", str(trace), "--engine-blocks", "5", "--dram-blocks", "0"]) == 2
    assert "sidecar has no tier" in capsys.readouterr().err


def test_cli_instant_single_tier_is_the_old_replay(tmp_path: Path) -> None:
    reqs = full_blocks_only(generate("agent", GenConfig(sessions=15, duration_s=300.0, seed=2,
                                                        scale=0.05)))
    trace = tmp_path / "t.jsonl"
    dump_trace(reqs, trace)
    out = tmp_path / "r.json"
    assert main(["replay", str(trace), "--policy", "ttl", "--engine-blocks", "0",
                 "--dram-blocks", "40", "--instant", "--no-decode-saves", "--trust-end",
                 "--no-then", "--json", str(out), "--no-progress"]) == 0
    row = json.loads(out.read_text())["results"][0]
    old = fleet_loop(reqs, "ttl", [TierBudget("dram", 40)])
    assert row["hit_blocks"] == old.hit_blocks and row["lookups"] == old.lookups
