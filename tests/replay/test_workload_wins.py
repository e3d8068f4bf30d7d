"""On generated agent and mixed traffic with hints, ``workload`` beats LRU and
the admission-filtered LRU at every capacity tried; multi-tier shows where hits
were served."""

from __future__ import annotations

import pytest

from kvstore.replay.generate import GenConfig, generate
from tests.replay.helpers import replay


@pytest.mark.parametrize("kind", ["agent", "mixed"])
def test_workload_beats_lru_and_filtered_lru(kind: str) -> None:
    reqs = generate(kind, GenConfig(sessions=250 if kind == "mixed" else 80,
                                    duration_s=400.0, seed=11, scale=0.1))
    for cap in (80, 160, 320):
        budget = [("hbm", cap)]
        w = replay(reqs, "workload", budget).hit_rate
        for base in ("lru", "lru+filter", "ttl"):
            b = replay(reqs, base, budget).hit_rate
            assert w > b, f"{kind} at {cap} blocks: workload {w:.3f} <= {base} {b:.3f}"


def test_multi_tier_reports_where_hits_were_served() -> None:
    reqs = generate("mixed", GenConfig(sessions=250, duration_s=400.0, seed=11, scale=0.1))
    budget = [("hbm", 40), ("dram", 80), ("disk", 200)]
    r = replay(reqs, "workload", budget)
    assert r.hit_rate_by_tier["hbm"] > 0 and r.hit_rate_by_tier["dram"] > 0
    assert sum(r.hit_rate_by_tier.values()) == pytest.approx(r.hit_rate)
    assert r.bytes_moved.get("hbm->dram", 0) > 0
    single = replay(reqs, "workload", budget[:1])
    assert r.hit_rate > single.hit_rate
