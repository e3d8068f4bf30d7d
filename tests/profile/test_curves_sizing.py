"""Capacity curves from the replay, and the sizing advice built on them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from kvstore.policies.cost import CostModel

from kvstore.config import load_config, parse_size
from kvstore.profile.curves import capacity_grid, measure_curve
from kvstore.profile.load import Trace
from kvstore.profile.model import Curve, CurvePoint
from kvstore.profile.report import profile_trace
from kvstore.profile.sizing import MODELS, model_kv, needed_blocks, sizing
from kvstore.replay.generate import GenConfig, generate


def test_model_table_kv_bytes_per_token() -> None:
    # layers x KV heads x head dim x 2 (K, V) x 2 bytes (bf16)
    assert model_kv("Llama-3-8B").bytes_per_token == 32 * 8 * 128 * 2 * 2 == 131_072
    assert model_kv("llama-3-70b").bytes_per_token == 327_680
    assert model_kv("mistral-7b").bytes_per_token == 131_072
    # the replay's cost model describes Qwen2.5-7B: the same figure
    assert MODELS["qwen2.5-7b"].bytes_per_token * 512 == CostModel().block_bytes
    with pytest.raises(ValueError, match="known: llama-3-8b"):
        model_kv("gpt-5")


def test_capacity_grid_doubles_up_to_the_footprint() -> None:
    assert capacity_grid(1000, 4) == [125, 250, 500, 1000]
    assert capacity_grid(3, 5) == [1, 2, 3]  # no duplicates, never 0
    with pytest.raises(ValueError, match="no blocks"):
        capacity_grid(0)


def test_needed_blocks_interpolates_between_measured_points() -> None:
    pts = [(100, 0.1), (200, 0.3), (400, 0.3)]
    assert needed_blocks(pts, 0.05) == (100, True)  # at most: nothing smaller was measured
    assert needed_blocks(pts, 0.1) == (100, True)
    assert needed_blocks(pts, 0.2) == (150, False)
    assert needed_blocks(pts, 0.3) == (200, False)
    assert needed_blocks(pts, 0.31) == (None, False)
    assert needed_blocks(pts, 0.0) == (0, False)


def test_sizing_targets_policy_and_toml(tmp_path: Path) -> None:
    pts = [CurvePoint("lru", 1000, 0.10), CurvePoint("lru", 2000, 0.30),
           CurvePoint("lru", 4000, 0.40),
           CurvePoint("workload", 1000, 0.20), CurvePoint("workload", 2000, 0.33),
           CurvePoint("workload", 4000, 0.38),
           CurvePoint("belady", 1000, 0.35), CurvePoint("belady", 2000, 0.40),
           CurvePoint("belady", 4000, 0.40)]
    s = sizing(Curve(tuple(pts), 0.40), 512, "llama-3-8b", 131_072, "t.jsonl")
    got = [(t.tier, t.blocks, t.at_most, t.policy, t.belady_blocks, t.belady_at_most)
           for t in s.targets]
    # 50% = 0.20: workload at (at most) 1,000 blocks, lru at 1,500; 80% = 0.32: workload
    # at 1,924, lru at 2,400; 95% = 0.38: lru at 3,600, workload at 4,000. Belady reaches
    # 50% and 80% at its smallest point already.
    assert got == [("hbm", 1000, True, "workload", 1000, True),
                   ("dram", 1924, False, "workload", 1000, True),
                   ("disk", 3600, False, "lru", 1600, False)]
    assert s.targets[1].gb == pytest.approx(1924 * 512 * 131_072 / 1e9)
    frag = tomllib.loads(s.toml)
    assert frag["engine"]["policy"] == "workload"  # the policy best at the DRAM size
    path = tmp_path / "kvstore.toml"
    path.write_text(s.toml)
    cfg = load_config(path, env={})  # the fragment is a valid config
    assert cfg.engine.policy == "workload"
    dram = parse_size(frag["dram"]["capacity"], "dram")
    assert cfg.dram.capacity == dram >= 1924 * 512 * 131_072
    assert cfg.disk.capacity >= 3600 * 512 * 131_072
    assert "HBM: leave >= 67.1 GB (or less)" in s.toml


def test_sizing_not_reached_and_no_reuse(tmp_path: Path) -> None:
    pts = (CurvePoint("lru", 10, 0.1), CurvePoint("belady", 10, 0.2))
    s = sizing(Curve(pts, 0.5), 512, "m", 1000)
    assert [t.blocks for t in s.targets] == [None, None, None]
    assert "not reached" in s.toml
    none = sizing(Curve((CurvePoint("lru", 10, 0.0),), 0.0), 512, "m", 1000)
    assert [t.blocks for t in none.targets] == [0, 0, 0]
    assert "no block is ever reused" in none.toml
    (tmp_path / "k.toml").write_text(none.toml)
    load_config(tmp_path / "k.toml", env={})


def test_curve_from_the_replay() -> None:
    reqs = generate("chat", GenConfig(sessions=40, seed=6, scale=0.3))
    trace = Trace("chat.jsonl", "mooncake+sessions", reqs, [r.timestamp_ms / 1e3 for r in reqs])
    prof, _ = profile_trace(trace, points=4)
    assert prof.reuse is not None and prof.curve is not None and prof.sizing is not None
    footprint = prof.reuse.distinct_blocks
    assert footprint is not None
    caps = capacity_grid(footprint, 4)
    assert prof.curve.policies() == ["lru", "workload", "belady"]
    for pol in ("lru", "workload", "belady"):
        assert [b for b, _ in prof.curve.of(pol)] == caps
    lru = dict(prof.curve.of("lru"))
    belady = dict(prof.curve.of("belady"))
    unbounded = prof.reuse.unbounded_hit_rate
    # at the footprint nothing is ever evicted: LRU is the unbounded cache
    assert lru[footprint] == pytest.approx(unbounded)
    for cap in caps:
        assert lru[cap] <= belady[cap] + 1e-12 <= unbounded + 1e-9
    assert [h for _, h in prof.curve.of("lru")] == sorted(lru.values())
    # the same call with explicit capacities gives the same points
    again = measure_curve(reqs, [caps[0]], ["lru"], unbounded)
    assert again.of("lru") == [(caps[0], lru[caps[0]])]
    targets = {t.tier: t for t in prof.sizing.targets}
    assert targets["disk"].blocks is not None and targets["disk"].blocks <= footprint
