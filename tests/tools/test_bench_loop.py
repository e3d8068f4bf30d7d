"""``kvstore bench-loop`` runs the real server's calls in process and reports CPU per call."""

from __future__ import annotations

from kvstore.tools import bench_loop


def test_bench_loop_times_a_lookup_and_each_block_operation() -> None:
    r = bench_loop.run(lookups=5, block=4096, blocks=8, batches=1)
    assert r["lookup_1000"]["calls"] == 5
    assert 0 < r["lookup_1000"]["min_ms"] <= r["lookup_1000"]["p50_ms"]
    for op in ("reserve", "commit", "acquire"):
        assert 0 < r["per_block"][op]["min_us"] <= r["per_block"][op]["p50_us"]
