"""Fleet replay: workers publish real event bytes, the router routes on the index they build."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from kvstore.policies.base import TierSpec
from kvstore.policies.cost import CostModel, read_bytes_per_s

from kvstore import policies
from kvstore.events import BlockRemoved, BlockStored, MemoryPublisher, decode_batch
from kvstore.events.media import tier_medium
from kvstore.replay.driver import TierBudget
from kvstore.replay.fleet import Worker, build_fleet, main, replay_fleet, run_fleet_on
from kvstore.replay.routing import ROUTERS, make_router
from kvstore.replay.trace import After, Request, dump_trace, load_trace

TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / \
    "conversation_trace.jsonl.gz"

BUDGETS = [TierBudget("hbm", 48), TierBudget("dram", 96), TierBudget("disk", 64)]
#: Tight tiers: blocks are demoted down to disk and dropped from it.
SMALL = [TierBudget("hbm", 16), TierBudget("dram", 24), TierBudget("disk", 32)]
MEDIUM = {"hbm": "gpu", "dram": "cpu", "disk": "disk"}


def specs(budgets: list[TierBudget]) -> list[TierSpec]:
    return [TierSpec(b.name, b.blocks, read_bytes_per_s(b.name)) for b in budgets]


def held(w: Worker) -> dict[str, set[int]]:
    """Trace ids each tier of a worker's engine holds."""
    out: dict[str, set[int]] = {b.name: set() for b in SMALL}
    for e in w.engine.index.entries():
        for t in e.tiers:
            out[t].add(int.from_bytes(e.key.block_hash, "big"))
    return out


def conversations(sessions: int = 24, turns: int = 6, seed: int = 1) -> list[Request]:
    """Multi-turn sessions: a shared 2-block system prompt, then each turn extends its
    session's history by 2-4 blocks; sessions interleave, about one request a second."""
    rng = random.Random(seed)
    next_id = 2
    reqs = []
    for s in range(sessions):
        history = [0, 1]
        t = rng.randrange(0, 60_000)
        for turn in range(turns):
            new = list(range(next_id, next_id + rng.randint(2, 4)))
            next_id += len(new)
            history += new
            kind = "end" if turn == turns - 1 else rng.choice(["user", "tool_call"])
            reqs.append(Request(t, len(history) * 512 - 100, 50, tuple(history),
                                session_id=f"s{s}", workload="chat",
                                after=After(kind, "search" if kind == "tool_call" else None)))
            history = history[:]
            t += rng.randrange(5_000, 40_000)
    reqs.sort(key=lambda r: r.timestamp_ms)
    return reqs


def test_prefix_routing_beats_random_and_spreads_load() -> None:
    trace = conversations()
    res = {r: replay_fleet(trace, 4, r, "lru", BUDGETS, seed=3) for r in ROUTERS}
    assert res["prefix"].hit_rate > 1.5 * res["random"].hit_rate
    assert res["prefix"].prefill_s_saved > 1.5 * res["random"].prefill_s_saved
    for r in res.values():
        assert len(r.workers) == 4
        assert sum(w.requests for w in r.workers) == r.requests == len(trace)
        assert sum(w.hit_blocks for w in r.workers) == r.hit_blocks
        assert r.request_spread >= 1.0 and r.work_spread >= 1.0
        assert all(w.requests > 0 for w in r.workers)
        assert all(w.event_gaps == 0 for w in r.workers)
    # prefix weighs load: the shared system prompt does not pull every request onto one worker
    assert res["prefix"].request_spread < 2.0
    assert res["load"].work_spread <= res["random"].work_spread + 0.05


@pytest.mark.parametrize("policy", policies.available())
@pytest.mark.parametrize("router", ["prefix", "random"])
def test_router_index_equals_union_of_worker_caches(policy: str, router: str) -> None:
    cost = CostModel()
    fleet, index = build_fleet(3, policy, SMALL, cost)
    chooser = make_router(router, index, cost, specs(SMALL), seed=5)
    res = run_fleet_on(conversations(sessions=16), fleet, chooser, router)
    assert sum(w.lookups for w in fleet) == res.lookups
    used: set[str] = set()
    for w in fleet:
        tiers = held(w)
        used.update(tier for tier, keys in tiers.items() if keys)
        for tier, keys in tiers.items():
            assert index.blocks(w.pod, MEDIUM[tier]) == keys, (w.pod, tier)
        assert w.feed.gaps == 0
    # Copies went down the tiers during the run, so the index followed stores and
    # removals on each (which tiers still hold blocks at the end varies).
    moved = set().union(*(w.engine.stats.moved_bytes for w in fleet))
    assert ("hbm", "dram") in moved, moved
    assert "hbm" in used and len(used) >= 2
    assert set(index.pods()) == {w.pod for w in fleet}


def test_event_stream_is_vllm_ordered_and_complete() -> None:
    """Decoded batches: contiguous sequence, int64 hashes = trace ids, a block's parent
    was announced before it (in this batch or an earlier one, on some medium: a
    demotion announces a chain's tail in the slower tier while its head is in the
    faster one; the room made for a copy may have taken the parent's last copy since,
    and the block stays useful, reachable again once its prefix is stored anew), and
    the stream alone rebuilds the cache."""
    cost = CostModel()
    fleet, index = build_fleet(2, "lru", SMALL, cost)
    taps = []
    for w in fleet:
        tap = MemoryPublisher()
        w.bus.add_publisher(tap)
        taps.append(tap)
    trace = conversations(sessions=10)
    run_fleet_on(trace, fleet, make_router("prefix", index, cost, specs(SMALL)), "prefix")
    ids = {h for r in trace for h in r.hash_ids}
    for w, tap in zip(fleet, taps, strict=True):
        assert [b.seq for b in tap.batches] == list(range(len(tap.batches)))
        # media by tier, in either vocabulary (STORAGE + LOCAL is the disk tier)
        seen: dict[str, set[int]] = {"gpu": set(), "cpu": set(), "disk": set()}
        announced: set[int] = set()
        removed = dict.fromkeys(seen, 0)
        for batch in tap.batches:
            events = decode_batch(batch.payload).events
            for ev in events:
                assert isinstance(ev, BlockStored | BlockRemoved)
                medium = tier_medium(ev.medium, ev.locality)
                assert medium in seen
                assert set(ev.block_hashes) <= ids
                if isinstance(ev, BlockStored):
                    parent = ev.parent_block_hash
                    assert parent is None or parent in announced
                    assert not seen[medium] & set(ev.block_hashes)
                    seen[medium].update(ev.block_hashes)  # type: ignore[arg-type]
                    announced.update(ev.block_hashes)  # type: ignore[arg-type]
                else:
                    assert set(ev.block_hashes) <= seen[medium]
                    seen[medium].difference_update(ev.block_hashes)
                    removed[medium] += len(ev.block_hashes)
        assert removed["gpu"] and removed["cpu"], removed  # evictions were published
        tiers = held(w)
        assert seen == {MEDIUM[t]: keys for t, keys in tiers.items()}


def test_cli_writes_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    dump_trace(conversations(sessions=6, turns=3), trace)
    out = tmp_path / "fleet.json"
    assert main([str(trace), "--workers", "2", "--hbm-blocks", "20", "--dram-blocks", "40",
                 "--json", str(out), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert all(f"| {r} " in table for r in ROUTERS)
    doc = json.loads(out.read_text())
    assert [r["router"] for r in doc["results"]] == list(ROUTERS)
    assert all(len(r["per_worker"]) == 2 for r in doc["results"])
    assert doc["meta"]["tiers_per_worker"] == {"hbm": 20, "dram": 40, "disk": 0}
    assert main([str(trace), "--workers", "0", "--no-progress"]) == 2
    assert main([str(trace), "--policy", "nope", "--no-progress"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


@pytest.mark.traces
@pytest.mark.skipif(not TRACE.exists(), reason=f"real trace not present at {TRACE}")
def test_conversation_trace_prefix_beats_random() -> None:
    trace = load_trace(TRACE)[:1500]
    budgets = [TierBudget("hbm", 500), TierBudget("dram", 2000)]
    rnd = replay_fleet(trace, 4, "random", "lru", budgets)
    pfx = replay_fleet(trace, 4, "prefix", "lru", budgets)
    assert pfx.hit_rate > 1.5 * rnd.hit_rate
    assert pfx.request_spread < 1.5


def test_kvstore_replay_runs_the_fleet_with_workers(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``kvstore replay --workers N --router ...`` runs the fleet replay (its capacities
    are the replay parser's lists, one value each)."""
    from kvstore.cli import main

    trace = tmp_path / "t.jsonl"
    dump_trace(conversations(sessions=4, turns=2), trace)
    assert main(["replay", str(trace), "--workers", "3", "--router", "prefix",
                 "--hbm-blocks", "10", "--dram-blocks", "20", "--no-progress"]) == 0
    assert "| prefix " in capsys.readouterr().out
    assert main(["replay", str(trace), "--workers", "3", "--hbm-blocks", "10,20"]) == 2


@pytest.mark.parametrize("policy", ["lru", "workload", "ttl"])
def test_a_fleet_of_one_is_the_served_replay(policy: str) -> None:
    """One worker plays each request through the served replay's own path: on a trace with
    partial last blocks and hints, over DRAM and disk, the same hits per tier, lookups
    and prefill saved as ``kvstore replay`` with the sidecar alone."""
    from kvstore.replay.generate import GenConfig, generate
    from tests.replay.helpers import replay

    trace = generate("agent", GenConfig(sessions=20, duration_s=300.0, seed=4, scale=0.05))
    assert any(r.input_length % 512 for r in trace)  # partial last blocks
    tiers = [("dram", 30), ("disk", 60)]
    served = replay(trace, policy, tiers)
    fleet = replay_fleet(trace, 1, "prefix", policy, [TierBudget(t, n) for t, n in tiers])
    assert fleet.lookups == served.lookups
    assert fleet.hit_blocks == served.hit_blocks > 0
    for t, _ in tiers:
        assert fleet.hit_rate_by_tier[t] == served.hits_by_tier[t], t
    assert fleet.prefill_s_saved == pytest.approx(served.prefill_s_saved)
