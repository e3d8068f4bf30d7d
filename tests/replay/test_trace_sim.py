from __future__ import annotations

import gzip
import json
from collections.abc import Hashable, Sequence
from pathlib import Path

import pytest
from kvstore.policies.base import BlockInfo, Hint, Move, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.lru import LRUPolicy

from kvstore.replay.sessions import SessionInferer
from kvstore.replay.sim import Simulator, TierBudget, tier_specs
from kvstore.replay.trace import After, Request, TraceError, dump_trace, load_trace

ONE = [TierBudget("hbm", 4, 1e13)]


def req(t: int, ids: Sequence[int], **kw: object) -> Request:
    return Request(t, len(ids) * 512 - 10, 10, tuple(ids), **kw)  # type: ignore[arg-type]


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


def test_prefix_stops_at_first_miss() -> None:
    sim = Simulator(LRUPolicy(tier_specs(ONE, CostModel())), ONE)
    sim.step(req(0, [1, 2, 3]))
    sim.policy.on_remove(2, "hbm")  # keep the simulator's own view consistent below
    sim.loc.pop(2)
    sim._use[0] -= sim.info.pop(2).size
    assert sim.step(req(1, [1, 2, 3])) == 1  # 3 is cached but after the miss at 2
    r = sim.result()
    assert r.lookups == 6 and r.hit_blocks == 1
    assert r.hit_rate == pytest.approx(1 / 6)


class Recorder(LRUPolicy):
    """LRU that records what the simulator tells it."""

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self.hints: list[tuple[Hint, float, list[tuple[Hashable, str]]]] = []
        self.infos: list[BlockInfo] = []

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        self.hints.append((hint, now, list(keys)))
        return [Move(k, t, "dram") for k, t in keys if t == "hbm"]

    def on_lookup(self, keys: Sequence[Hashable], hit_tiers: Sequence[str | None],
                  info: BlockInfo, now: float) -> list[Move]:
        self.infos.append(info)
        return []


def test_hint_arrives_at_request_end_and_moves_run() -> None:
    budgets = [TierBudget("hbm", 4, 1e13), TierBudget("dram", 8, 25e9)]
    pol = Recorder(tier_specs(budgets, CostModel()))
    sim = Simulator(pol, budgets)
    sim.step(req(1000, [1, 2], session_id="a", workload="agent",
                 after=After("tool_call", "search")))
    hint, now, keys = pol.hints[0]
    assert (hint.session_id, hint.event, hint.tool, hint.workload) == ("a", "tool_call",
                                                                      "search", "agent")
    assert now == 1.0 and hint.expected_gap_s is None
    assert sorted(keys) == [(1, "hbm"), (2, "hbm")]
    assert sim.loc == {1: 1, 2: 1}  # offloaded to dram by the hint's moves
    sim.step(req(5000, [1, 2, 3], session_id="a"))
    r = sim.result()
    assert r.hit_rate_by_tier == {"hbm": 0.0, "dram": pytest.approx(2 / 5)}
    assert r.bytes_moved["hbm->dram"] == 2 * CostModel().block_bytes
    assert r.bytes_moved["dram->hbm"] == 2 * CostModel().block_bytes
    assert r.prefill_s_saved > 0


def test_tier_that_loses_to_recompute_is_not_used() -> None:
    budgets = [TierBudget("hbm", 1, 1e13), TierBudget("remote", 8, 1e6)]
    pol = LRUPolicy(tier_specs(budgets, CostModel()))
    sim = Simulator(pol, budgets)
    sim.step(req(0, [1]))
    sim.step(req(1, [2]))
    assert sim.loc == {1: 1, 2: 0}  # 1 was demoted to the remote tier
    assert sim.step(req(2, [1])) == 0  # loading it would lose to recompute
    assert sim.result().hit_rate_by_tier["remote"] == 0.0


def test_sessions_inferred_from_prefix_chains() -> None:
    inf = SessionInferer()
    a1 = inf.session_for([0, 1, 10, 11, 12])
    b1 = inf.session_for([0, 1, 20, 21])      # shares only the system prompt [0, 1]
    a2 = inf.session_for([0, 1, 10, 11, 13, 14])  # continues a (its tail 12 was partial)
    b2 = inf.session_for([0, 1, 20, 22, 23])
    assert a1 == a2 and b1 == b2 and a1 != b1
