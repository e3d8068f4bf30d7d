from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Hashable, Sequence
from pathlib import Path

import pytest
from kvstore.policies.base import Hint, Move, Plan, RequestInfo, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.sessions import Sessions
from kvstore.replay.driver import NAMESPACE, TierBudget, block_hash
from kvstore.replay.node import Run, engine_node
from kvstore.replay.served import sidecar_alone
from kvstore.replay.trace import After, Request, TraceError, dump_trace, load_trace
from kvstore.types import SessionKey

ONE = [TierBudget("hbm", 4)]


def req(t: int, ids: Sequence[int], **kw: object) -> Request:
    """Full blocks ``ids`` and 10 tokens past them (a partial last block without an id:
    the served replay, as vLLM, looks up and saves only full blocks)."""
    return Request(t, len(ids) * 512 + 10, 10, tuple(ids), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_trace_round_trip(tmp_path: Path, suffix: str) -> None:
    reqs = [req(5, [1, 2], session_id="a", workload="agent", after=After("tool_call", "search")),
            req(1, [1]), req(9, [1, 2, 3], after=After("end"))]
    path = tmp_path / f"t{suffix}"
    assert dump_trace(reqs, path) == 3
    back = load_trace(path)
    assert [r.timestamp_ms for r in back] == [1, 5, 9]
    assert back[1] == reqs[0]
    assert back[2].after == After("end")


def test_plain_mooncake_line(tmp_path: Path) -> None:
    line = {"timestamp": 27482, "input_length": 6955, "output_length": 52,
            "hash_ids": [46, 47, 48]}
    path = tmp_path / "m.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(line) + "\n\n")
    (r,) = load_trace(path)
    assert r.hash_ids == (46, 47, 48) and r.session_id is None and r.after is None


def test_bad_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 1, "input_length": 1, "hash_ids": [1]}\n{"timestamp": 2}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2"):
        load_trace(path)
    path.write_text('{"timestamp": 1, "input_length": 1, "hash_ids": [1], '
                    '"after": {"kind": "lunch"}}\n')
    with pytest.raises(TraceError, match="after.kind"):
        load_trace(path)


class Player:
    """The served replay's per-request path over the engine (the sidecar alone, untimed),
    one request at a time."""

    def __init__(self, policy: str, budgets: list[TierBudget],
                 cost: CostModel | None = None) -> None:
        self.cost = cost or CostModel()
        self.node, side = engine_node(policy, sidecar_alone(budgets), self.cost, None)
        self.engine = side.engine
        self._n = 0

    def step(self, r: Request) -> int:
        """Play ``r`` at its time; returns its served prefix (blocks)."""
        async def go() -> int:
            t = r.timestamp_ms / 1000.0
            run = Run(r, f"r{self._n}", t, False, self._n)
            self._n += 1
            await self.node.advance(t)
            await self.node.start(run, t)
            await self.node.prefill_done(run)
            await self.node.finish(run, t)
            return run.served

        return asyncio.run(go())

    def tiers(self) -> dict[int, list[str]]:
        return {int.from_bytes(e.key.block_hash, "big"): list(e.tiers)
                for e in self.engine.index.entries()}


def test_prefix_stops_at_first_miss() -> None:
    p = Player("lru", ONE)
    p.step(req(0, [1, 2, 3]))
    asyncio.run(p.engine.delete(NAMESPACE, [block_hash(2)]))
    assert p.step(req(1, [1, 2, 3])) == 1  # 3 is cached but after the miss at 2
    r = p.node.result(0.0)
    assert r.lookups == 6 and r.hit_blocks == 1
    assert r.hit_rate == pytest.approx(1 / 6)


class Recorder(LRUPolicy):
    """LRU that records what the engine tells it and offloads on every hint."""

    name = "recorder"

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self.hints: list[tuple[Hint, float, list[tuple[Hashable, str]]]] = []
        self.requests: list[RequestInfo] = []

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        self.hints.append((hint, now, list(keys)))
        return [Move(k, t, "dram") for k, t in keys if t == "hbm"]

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        self.requests.append(req)
        return super().on_request(req, now)


def test_hint_arrives_at_request_end_and_moves_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstore import policies

    monkeypatch.setitem(policies._REGISTRY, "recorder",  # type: ignore[attr-defined]
                        f"{__name__}:Recorder")
    budgets = [TierBudget("hbm", 4), TierBudget("dram", 8)]
    p = Player("recorder", budgets)
    pol = p.engine.policy.inner
    assert isinstance(pol, Recorder)
    p.step(req(1000, [1, 2], session_id="a", workload="agent",
               after=After("tool_call", "search")))
    hint, now, keys = pol.hints[0]
    assert (hint.session_id, hint.event, hint.tool, hint.workload) == (
        SessionKey("trace", "a"), "tool_call", "search", "agent")
    assert now == 1.0 and hint.expected_gap_s is None
    assert sorted(k.block_hash for k, _t in keys) == [block_hash(1), block_hash(2)]
    assert {t for _k, t in keys} == {"hbm"}
    assert p.tiers() == {1: ["dram"], 2: ["dram"]}  # offloaded by the hint's moves
    first = pol.requests[0]
    assert first.session_id == SessionKey("trace", "a") and first.workload == "agent"
    # the lookup names full blocks only, so its last block is a whole one
    assert first.block_tokens == 512 and first.last_tokens == 512
    p.step(req(5000, [1, 2, 3], session_id="a"))
    r = p.node.result(0.0)
    assert p.node.hits["hbm"] == 0 and p.node.hits["dram"] == 2 and r.lookups == 5
    moved = p.engine.stats.moved_bytes
    # Down: the write-back copies of 1, 2 (the hint's move then only drops the hbm copies)
    # and of 3; up: the prefetch of the returning session's 1, 2.
    assert moved[("hbm", "dram")] == 3 and moved[("dram", "hbm")] == 2
    assert r.prefill_s_saved > 0


def test_tier_that_loses_to_recompute_is_not_used() -> None:
    # Prefill so fast that reading a 29 MB block from disk loses to recomputing it.
    cost = CostModel(prefill_tokens_per_s=1e6)
    p = Player("lru", [TierBudget("hbm", 1), TierBudget("disk", 8)], cost)
    p.step(req(0, [1]))
    p.step(req(1000, [2]))
    assert p.tiers() == {1: ["disk"], 2: ["hbm", "disk"]}  # write-back, then eviction
    assert p.step(req(2000, [1])) == 0  # loading it would lose to recompute
    assert p.node.hits["disk"] == 0


def test_sessions_inferred_from_prefix_chains() -> None:
    inf = Sessions()
    a1 = inf.infer("ns", [0, 1, 10, 11, 12])
    b1 = inf.infer("ns", [0, 1, 20, 21])      # shares only the system prompt [0, 1]
    a2 = inf.infer("ns", [0, 1, 10, 11, 13, 14])  # continues a (its tail 12 was partial)
    b2 = inf.infer("ns", [0, 1, 20, 22, 23])
    assert a1 == a2 and b1 == b2 and a1 != b1
