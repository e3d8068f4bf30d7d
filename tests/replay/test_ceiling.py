"""The in-sample diagnostic: ``workload`` restarted with what it learned from the whole trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvstore.policies.cost import CostModel
from kvstore.policies.workload import WorkloadPolicy

from kvstore.replay import ceiling
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.sim import Simulator, TierBudget, tier_specs
from kvstore.replay.trace import dump_trace

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
