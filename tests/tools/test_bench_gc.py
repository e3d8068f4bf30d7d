"""``kvstore bench-gc`` fills the real server twice, Python's collections against the heap
frozen as ``kvstore serve`` keeps it, and says what a collection walks in each."""

from __future__ import annotations

import gc

from kvstore.tools import bench_gc


def test_bench_gc_fills_the_server_with_and_without_the_keeper() -> None:
    frozen = gc.get_freeze_count()
    r = bench_gc.run(blocks=2000, block=256, every_s=0.01)
    off, on = r["rows"]
    assert (off["gc_freeze_s"], on["gc_freeze_s"]) == (0.0, 0.01)
    for row in (off, on):
        assert row["blocks"] == 2000 and row["fill_s"] > 0 and row["full_collection_ms"] >= 0
    # every stored block keeps tracked objects: without the keeper a collection walks
    # them all, with it only what the last interval made
    assert off["walked_objects"] > 5 * 2000
    assert on["walked_objects"] < off["walked_objects"] // 2
    assert gc.get_freeze_count() <= frozen  # nothing of the run's left frozen
