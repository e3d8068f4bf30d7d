"""Fleet replay: each worker is the served topology (vLLM's prefix cache in front, the
sidecar's tiers behind); both publish real event bytes, the router routes on the index
they build."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from kvstore.connectors.router import PrefixIndex
from kvstore.policies.base import Plan, RequestInfo, TierSpec
from kvstore.policies.cost import CostModel, read_bytes_per_s
from kvstore.policies.lru import LRUPolicy

from kvstore import policies
from kvstore.events import BlockRemoved, BlockStored, MemoryPublisher, decode_batch
from kvstore.events.media import tier_medium
from kvstore.replay.driver import TierBudget
from kvstore.replay.engine_cache import EngineCache
from kvstore.replay.fleet import Worker, build_fleet, replay_fleet, run_fleet_on
from kvstore.replay.routing import ROUTERS, make_router
from kvstore.replay.served import ServedConfig, replay_served, sidecar_alone
from kvstore.replay.served_config import decode_block_ids
from kvstore.replay.trace import After, Request, dump_trace, load_trace

TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / \
    "conversation_trace.jsonl.gz"

MEDIUM = {"engine": "gpu", "dram": "cpu", "disk": "disk"}


def served(engine: int, dram: int, disk: int = 0, hold: int | None = None,
           **kw: object) -> ServedConfig:
    """A worker: ``engine`` blocks of vLLM's cache, the sidecar's DRAM (and disk), timed
    (the default engine model), the connector's hold budget (a quarter by default)."""
    sidecar = tuple(TierBudget(t, n) for t, n in (("dram", dram), ("disk", disk)) if n)
    return ServedConfig(engine, sidecar, engine // 4 if hold is None else hold,
                        **kw)  # type: ignore[arg-type]


CONFIG = served(48, 96, 64)
#: Tight tiers: the engine evicts, blocks are demoted down to disk and dropped from it.
SMALL = served(16, 24, 32)


def specs(config: ServedConfig) -> list[TierSpec]:
    return [TierSpec(b.name, b.blocks, read_bytes_per_s(b.name)) for b in config.sidecar]


def fleet_of(n: int, policy: str, config: ServedConfig, trace: Sequence[Request]
             ) -> tuple[list[Worker], PrefixIndex]:
    cost = CostModel()
    return build_fleet(n, policy, config, cost, decode_block_ids(trace, cost.block_tokens))


def held(w: Worker) -> dict[str, set[int]]:
    """Trace ids each tier of a worker holds: its engine cache and each sidecar tier."""
    out: dict[str, set[int]] = {"engine": w.cache.cached(),
                                **{b.name: set() for b in w.config.sidecar}}
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


class Refuser(LRUPolicy):  # type: ignore[misc]
    """Admits nothing to the sidecar and asks for no keep."""

    name = "refuser"

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        return Plan({}, keep_s=0.0)


@pytest.fixture
def refuser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(policies._REGISTRY, "refuser", f"{__name__}:Refuser")


class Heard:
    """A cache listener that records what it hears."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], int | None]] = []

    def stored(self, blocks: Sequence[int], parent: int | None) -> None:
        self.calls.append(("stored", list(blocks), parent))

    def removed(self, blocks: Sequence[int]) -> None:
        self.calls.append(("removed", list(blocks), None))


def test_engine_cache_announces_what_vllm_publishes() -> None:
    """A block is announced when it enters the cache (runs of new blocks, parent the block
    before), not on a hit nor when freed (it stays cached), removed when evicted to make
    room (before the stores of that allocation); a partial block never."""
    heard = Heard()
    c = EngineCache(4, listener=heard)
    c.release(c.acquire([1, 2, 3], partial=True))
    assert heard.calls == [("stored", [1, 2, 3], None)]
    held = c.acquire([1, 2, 7, 8])  # 3 was freed first: evicted for 8
    assert heard.calls[1:] == [("removed", [3], None), ("stored", [7, 8], 2)]
    c.extend(held, [9], parent=8)  # no room: every slot pinned, nothing cached or said
    assert len(heard.calls) == 3 and c.cached() == {1, 2, 7, 8}
    c.release(held)  # freed, tail first: still cached, nothing said
    assert len(heard.calls) == 3 and c.match([1, 2, 7, 8]) == 4
    c.acquire([5])
    assert heard.calls[3:] == [("removed", [8], None), ("stored", [5], None)]


def test_prefix_routing_beats_random_and_spreads_load() -> None:
    trace = conversations()
    res = {r: replay_fleet(trace, 4, r, "lru", CONFIG, seed=3) for r in ROUTERS}
    assert res["prefix"].hit_rate > 1.5 * res["random"].hit_rate
    assert res["prefix"].prefill_s_saved > 1.5 * res["random"].prefill_s_saved
    for r in res.values():
        assert len(r.workers) == 4
        assert sum(w.requests for w in r.workers) == r.requests == len(trace)
        assert sum(w.hit_blocks for w in r.workers) == r.hit_blocks
        assert r.hit_blocks == pytest.approx(r.lookups * sum(r.hit_rate_by_tier.values()))
        assert set(r.hit_rate_by_tier) == {"engine", "dram", "disk"}
        assert r.request_spread >= 1.0 and r.work_spread >= 1.0
        assert all(w.requests > 0 for w in r.workers)
        assert all(w.event_gaps == 0 for w in r.workers)
    # prefix weighs load: the shared system prompt does not pull every request onto one worker
    assert res["prefix"].request_spread < 2.0
    assert res["load"].work_spread <= res["random"].work_spread + 0.05
    # the engine's own cache serves part of what prefix routing wins
    assert res["prefix"].hit_rate_by_tier["engine"] > res["random"].hit_rate_by_tier["engine"]


@pytest.mark.parametrize("policy", policies.available())
@pytest.mark.parametrize("router", ["prefix", "random"])
def test_router_index_equals_union_of_worker_caches(policy: str, router: str) -> None:
    """After a replay the router's index is, per pod and medium, what the worker's engine
    cache (``gpu``) and its sidecar's tiers hold."""
    trace = conversations(sessions=16)
    fleet, index = fleet_of(3, policy, SMALL, trace)
    chooser = make_router(router, index, CostModel(), specs(SMALL), seed=5)
    res = run_fleet_on(trace, fleet, chooser, router)
    assert sum(w.lookups for w in fleet) == res.lookups
    used: set[str] = set()
    for w in fleet:
        tiers = held(w)
        used.update(tier for tier, keys in tiers.items() if keys)
        for tier, keys in tiers.items():
            assert index.blocks(w.pod, MEDIUM[tier]) == keys, (w.pod, tier)
        assert w.feed.gaps == 0
        assert w.vllm_cache.blocks() == tiers["engine"]  # what the sidecar mirrored of vLLM
        assert w.engine_events.blocks_removed > 0  # the engine cache evicted, and said so
    # Copies went down the sidecar's tiers during the run, so the index followed stores
    # and removals on each (which tiers still hold blocks at the end varies).
    moved = set().union(*(w.engine.stats.moved_bytes for w in fleet))
    assert ("dram", "disk") in moved, moved
    assert "engine" in used and len(used) >= 2
    assert set(index.pods()) == {w.pod for w in fleet}


def test_event_stream_is_vllm_ordered_and_complete() -> None:
    """Decoded batches: contiguous sequence, int64 hashes = trace ids, a block's parent
    was announced before it (in this batch or an earlier one, on some medium: a
    demotion announces a chain's tail in the slower tier while its head is in the
    faster one; the room made for a copy may have taken the parent's last copy since,
    and the block stays useful, reachable again once its prefix is stored anew), the
    engine cache's events are vLLM's (medium ``GPU``, no locality), and the stream alone
    rebuilds the engine cache and the sidecar's tiers."""
    trace = conversations(sessions=10)
    fleet, index = fleet_of(2, "lru", SMALL, trace)
    taps = []
    for w in fleet:
        tap = MemoryPublisher()
        w.bus.add_publisher(tap)
        taps.append(tap)
    run_fleet_on(trace, fleet, make_router("prefix", index, CostModel(), specs(SMALL)),
                 "prefix")
    ids = {h for r in trace for h in r.hash_ids}
    ids |= {d for dec in decode_block_ids(trace, 512) for d in dec}
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
                if medium == "gpu":
                    assert ev.medium == "GPU" and ev.locality is None
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
        assert seen == {MEDIUM[t]: keys for t, keys in held(w).items()}


def test_engine_hit_needs_no_policy_and_the_router_sees_it(refuser: None) -> None:
    """A block a worker computed is in its engine cache: the session's next request,
    routed there, hits it although the policy admitted nothing to the sidecar, and the
    router found that worker from the engine's own events (medium ``gpu``). The fleet's
    old configuration (the sidecar alone, with a policy-managed ``hbm`` tier) had no
    engine cache, so a refusing policy left no hit and the index no ``gpu`` block."""
    a1 = Request(0, 8 * 512 - 100, 10, tuple(range(1, 9)), session_id="a",
                 after=After("user"))
    b1 = Request(0, 8 * 512 - 100, 10, tuple(range(100, 108)), session_id="b",
                 after=After("user"))
    a2 = Request(60_000, 10 * 512 - 100, 10, tuple(range(1, 11)), session_id="a",
                 after=After("user"))
    trace = [b1, a1, a2]  # b1 takes w0: by load alone a2 would go to w0 too (a tie)
    cfg = served(64, 32)
    fleet, index = fleet_of(2, "refuser", cfg, trace)
    res = run_fleet_on(trace, fleet, make_router("prefix", index, CostModel(), specs(cfg)),
                       "prefix")
    assert res.hit_rate_by_tier["dram"] == 0.0  # the sidecar stored nothing
    home = next(w for w in fleet if 100 not in w.cache)  # a1's worker, not b1's
    assert home.requests == 2  # a2 went where a1's blocks are
    # a1's full blocks (7, the 8th is partial); a2 reaches 9: 7 engine hits
    assert home.hits["engine"] == res.hit_blocks == 7
    assert index.blocks(home.pod, "gpu") == home.cache.cached() >= set(range(1, 10))
    assert all(not index.blocks(w.pod, "cpu") for w in fleet)


def test_cli_writes_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvstore.cli import main

    trace = tmp_path / "t.jsonl"
    dump_trace(conversations(sessions=6, turns=3), trace)
    out = tmp_path / "fleet.json"
    assert main(["replay", str(trace), "--workers", "2", "--engine-blocks", "20",
                 "--dram-blocks", "40", "--json", str(out), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert all(f"| {r} " in table for r in ROUTERS)
    assert "from engine" in table and "from dram" in table
    doc = json.loads(out.read_text())
    assert [r["router"] for r in doc["results"]] == list(ROUTERS)
    assert all(len(r["per_worker"]) == 2 for r in doc["results"])
    assert doc["meta"]["tiers_per_worker"] == {"dram": 40}
    assert doc["meta"]["engine_blocks"] == 20 and doc["meta"]["hold_budget_blocks"] == 5
    assert all(set(r["hit_rate_by_tier"]) == {"engine", "dram"} for r in doc["results"])
    assert main(["replay", str(trace), "--workers", "0", "--no-progress"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err
    assert main(["replay", str(trace), "--workers", "2", "--policy", "nope",
                 "--no-progress"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_fleet_refuses_hbm_blocks_as_the_replay_does(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``--hbm-blocks`` given to the fleet fails with the single replay's error (the
    fleet took it as a policy-managed GPU tier before)."""
    from kvstore.cli import main
    from kvstore.replay.cli import HBM_GONE

    trace = tmp_path / "t.jsonl"
    dump_trace(conversations(sessions=2, turns=2), trace)
    assert main(["replay", str(trace), "--hbm-blocks", "10", "--no-progress"]) == 2
    single = capsys.readouterr().err
    assert main(["replay", str(trace), "--workers", "2", "--hbm-blocks", "10",
                 "--dram-blocks", "20", "--no-progress"]) == 2
    fleet = capsys.readouterr().err
    assert fleet == single == f"kvstore replay: {HBM_GONE}\n"
    with pytest.raises(ValueError, match="sidecar tier 'hbm'"):
        build_fleet(1, "lru", sidecar_alone([TierBudget("hbm", 10)]), CostModel())


@pytest.mark.traces
@pytest.mark.skipif(not TRACE.exists(), reason=f"real trace not present at {TRACE}")
def test_conversation_trace_prefix_beats_random() -> None:
    trace = load_trace(TRACE)[:1500]
    cfg = served(500, 2000)
    rnd = replay_fleet(trace, 4, "random", "lru", cfg)
    pfx = replay_fleet(trace, 4, "prefix", "lru", cfg)
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
                 "--engine-blocks", "10", "--dram-blocks", "20", "--instant",
                 "--no-progress"]) == 0
    assert "| prefix " in capsys.readouterr().out
    assert main(["replay", str(trace), "--workers", "3", "--dram-blocks", "10,20"]) == 2
    assert "one value per capacity" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["lru", "workload", "ttl"])
@pytest.mark.parametrize("topology", ["served", "sidecar alone"])
def test_a_fleet_of_one_is_the_served_replay(policy: str, topology: str) -> None:
    """One worker plays each request through the served replay's own path: on a trace with
    partial last blocks and hints, with vLLM's cache in front (timed, decode saves, holds)
    or the sidecar alone, over DRAM and disk, the same hits per tier (the engine's too),
    lookups, prefill saved and TTFT as ``kvstore replay``."""
    import asyncio

    from kvstore.replay.generate import GenConfig, generate

    trace = generate("agent", GenConfig(sessions=20, duration_s=300.0, seed=4, scale=0.05))
    assert any(r.input_length % 512 for r in trace)  # partial last blocks
    cfg = (served(40, 30, 60) if topology == "served"
           else sidecar_alone([TierBudget("dram", 30), TierBudget("disk", 60)]))
    one = asyncio.run(replay_served(trace, policy, cfg, CostModel()))
    fleet = replay_fleet(trace, 1, "prefix", policy, cfg)
    assert fleet.lookups == one.lookups
    assert fleet.hit_blocks == one.hit_blocks > 0
    for t in ("engine", "dram", "disk"):
        assert fleet.hit_rate_by_tier[t] == one.hits_by_tier[t], t
    assert (fleet.hit_rate_by_tier["engine"] > 0) == (topology == "served")
    assert fleet.prefill_s_saved == pytest.approx(one.prefill_s_saved)
    assert fleet.ttft_p50_s == pytest.approx(one.ttft_p50_s)
    assert fleet.holds_made == one.holds_made
