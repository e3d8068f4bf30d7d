"""The in-sample diagnostic: ``workload`` restarted with what it learned from the whole trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvstore.policies.base import BlockInfo
from kvstore.policies.cost import CostModel
from kvstore.policies.workload import WorkloadPolicy

from kvstore.replay import ceiling
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.sim import Simulator, TierBudget, tier_specs
from kvstore.replay.trace import Request, dump_trace

CHAT = GenConfig(sessions=120, duration_s=900.0, seed=7, scale=0.1)


def test_in_sample_run_starts_from_the_learned_statistics() -> None:
    reqs = generate("chat", CHAT)
    budget = [TierBudget("hbm", 60, 1e13)]
    specs = tier_specs(budget, CostModel())
    learned = WorkloadPolicy(specs)
    Simulator(learned, budget).run(reqs)
    cls = next(c for c in learned.model._fine if learned.model.observations(c)[1] > 0)
    lam = learned._t["hbm"].base
    fresh = WorkloadPolicy(specs)
    assert fresh.model.observations(cls) == (0, 0)
    fresh.adopt(learned, span_s=900.0, start=0.0)
    assert fresh.model.observations(cls) == learned.model.observations(cls)
    assert fresh._t["hbm"].lam == lam
    assert fresh.hold(cls, "hbm", 0.0) == learned.model.hold(cls, lam, 0.0)

    online, fitted = ceiling.in_sample(reqs, budget)
    assert online.lookups == fitted.lookups == sum(len(r.hash_ids) for r in reqs)
    assert fitted.policy == "workload (in-sample)"
    assert 0.0 < online.hit_rate < 1.0 and 0.0 < fitted.hit_rate < 1.0


def test_cli_prints_a_table_and_refuses_bad_input(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "chat.jsonl"
    dump_trace(generate("chat", GenConfig(sessions=30, duration_s=300.0, seed=2, scale=0.05)),
               trace)
    assert ceiling.main([str(trace), "--hbm-blocks", "20,40"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| hbm blocks |")
    assert [line.split("|")[1].strip() for line in out[2:]] == ["20", "40"]
    assert ceiling.main([str(tmp_path / "missing.jsonl"), "--hbm-blocks", "20"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert ceiling.main([str(trace), "--hbm-blocks", "0"]) == 2
    assert "--hbm-blocks must be >= 1" in capsys.readouterr().err


def test_returns_by_length_counts_sessions_that_come_back() -> None:
    reqs = [
        Request(0, 700, 10, (0, 1), session_id="a"),          # 2 blocks, back after 60 s
        Request(1_000, 4000, 10, (0, 20, 21, 22, 23, 24, 25, 26), session_id="b"),  # 8, never
        Request(60_000, 1100, 10, (0, 1, 2), session_id="a"),  # 3 blocks, back after 200 s
        Request(260_000, 1600, 10, (0, 1, 2, 3), session_id="a"),  # 4 blocks, last
    ]
    rows = ceiling.returns_by_length(reqs, buckets=(3, 8))
    by = {r.label: r for r in rows}
    assert [r.label for r in rows] == ["< 3", "3-7", ">= 8", "all"]
    assert (by["< 3"].requests, by["< 3"].gaps) == (1, [60.0])
    assert (by["3-7"].requests, by["3-7"].gaps) == (2, [200.0])
    assert by["3-7"].back == 0.5 and by["3-7"].back_within(120.0) == 0.0
    assert (by[">= 8"].requests, by[">= 8"].back, by[">= 8"].median_gap) == (1, 0.0, None)
    assert by["all"].requests == 4 and by["all"].median_gap == 130.0


def test_returns_by_length_infers_sessions_from_prefix_chains() -> None:
    reqs = [Request(0, 1100, 10, (0, 7, 8)), Request(90_000, 1600, 10, (0, 7, 8, 9)),
            Request(95_000, 1100, 10, (0, 40, 41))]
    rows = ceiling.returns_by_length(reqs, buckets=(3,))
    assert rows[-1].gaps == [90.0]  # the third request shares only the head: a new session


def test_oracle_bit_is_the_future_and_is_worth_hits() -> None:
    specs = tier_specs([TierBudget("hbm", 10, 1e13)], CostModel())
    policy = ceiling.OracleWorkload(specs, CostModel(), {"k": [0.0, 50.0, 500.0]}, 100.0)
    info = BlockInfo("k", 1, request_blocks=1)
    policy.on_lookup(["k"], [None], info, 0.0)
    assert policy._hist["k"][0][0] == "unknown|soon"  # next use 50 s later
    policy.on_lookup(["k"], ["hbm"], info, 50.0)
    assert policy._hist["k"][0][0] == "unknown|late"  # next use 450 s later
    policy.on_lookup(["k"], [None], info, 500.0)
    assert policy._hist["k"][0][0] == "unknown|late"  # never again

    reqs = generate("chat", CHAT)
    budget = [TierBudget("hbm", 60, 1e13)]
    online, _ = ceiling.in_sample(reqs, budget)
    assert ceiling.oracle(reqs, budget, 300.0).hit_rate > online.hit_rate
    with pytest.raises(ValueError, match="--oracle-s must be > 0"):
        ceiling.oracle(reqs, budget, 0.0)


def test_cli_prints_the_returns_table_and_oracle_columns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "chat.jsonl"
    n = dump_trace(generate("chat", GenConfig(sessions=30, duration_s=300.0, seed=2,
                                               scale=0.05)), trace)
    assert ceiling.main([str(trace), "--returns", "--hbm-blocks", "20",
                         "--oracle-s", "60", "--oracle-s", "600"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| request blocks |") and out[6].startswith(f"| all | {n:,} |")
    assert out[8].endswith("| oracle 60 s bit | oracle 600 s bit |")
    assert len(out[10].split("|")) == 7
    assert ceiling.main([str(trace), "--oracle-s", "-1"]) == 2
    assert "--oracle-s must be > 0" in capsys.readouterr().err
