"""``kvstore bench-gc``: the cyclic collector's pauses on the event loop, heap frozen or not.

Fills a server (``kvstore serve``'s embedded defaults, DRAM only, in process, on its
loop: :func:`~kvstore.tools.bench_loop.served_config`) with ``--blocks`` blocks through
the servicer's Put, 500 a call, as a client sends them, twice in one process: with
Python's own collections (``server.gc_freeze_s = 0``) and with the heap frozen every
``--every-s`` seconds (:func:`~kvstore.server.heap.keep_frozen`, what ``kvstore serve``
runs), in turn. Every collection is timed (``gc.callbacks``): they run
on the event loop, and nothing else runs there meanwhile. Then one full collection of
the filled server is timed, as the next automatic one would be.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kvstore.server.app import run_served

__all__ = ["main", "run"]

_PER_PUT = 500


async def _fill(blocks: int, block: int, every_s: float) -> dict[str, Any]:
    from kvstore.client._common import put_requests
    from kvstore.server.app import KVStoreServer
    from kvstore.server.heap import keep_frozen, settle_startup
    from kvstore.tools.bench_loop import _Context, served_config
    from kvstore.tools.measure import make_blocks

    srv = KVStoreServer(served_config(tempfile.mkdtemp(prefix="kvstore-bench-gc-"),
                                      blocks * block, dram_only=True))
    await srv.start()
    settle_startup()
    keeper = asyncio.get_running_loop().create_task(keep_frozen(every_s)) if every_s else None
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(timed)
    ctx = _Context()
    try:
        assert srv.servicer is not None
        t0 = time.perf_counter()
        for c in range(blocks // _PER_PUT):
            msgs = list(put_requests(f"bench-gc-{c % 64}", make_blocks(_PER_PUT, block, seed=c),
                                     {}))  # (what a client sends)

            async def stream(m: list[Any] = msgs) -> AsyncIterator[Any]:
                for msg in m:
                    yield msg

            stored = (await srv.servicer.Put(stream(), ctx)).stored
            if stored != _PER_PUT:
                raise RuntimeError(f"put stored {stored} of {_PER_PUT}")
            await asyncio.sleep(0)  # (the keeper runs between calls, as in a server)
        fill_s = time.perf_counter() - t0
        gc.callbacks.remove(timed)
        walked = len(gc.get_objects())
        t1 = time.perf_counter()
        gc.collect()
        full_ms = (time.perf_counter() - t1) * 1e3
    finally:
        if timed in gc.callbacks:
            gc.callbacks.remove(timed)
        if keeper is not None:
            keeper.cancel()
        await srv.stop(0)
    ms = sorted(p * 1e3 for _, p in pauses)
    return {
        "gc_freeze_s": every_s, "blocks": blocks, "fill_s": round(fill_s, 2),
        "collections": len(pauses), "full_collections": sum(1 for g, _ in pauses if g == 2),
        "pause_max_ms": round(ms[-1], 2) if ms else 0.0,
        "pause_p99_ms": round(ms[int(len(ms) * 0.99)], 2) if ms else 0.0,
        "pause_total_ms": round(sum(ms), 1),
        "walked_objects": walked, "full_collection_ms": round(full_ms, 1)}


async def _run(blocks: int, block: int, every_s: float) -> dict[str, Any]:
    rows = []
    for freeze in (0.0, every_s):
        rows.append(await _fill(blocks, block, freeze))
        gc.unfreeze()  # (the next fill starts from an unfrozen heap, as a new process)
        gc.collect()
    return {"load_average": round(os.getloadavg()[0], 2), "rows": rows}


def run(blocks: int = 100_000, block: int = 1024, every_s: float = 0.25) -> dict[str, Any]:
    if blocks < _PER_PUT or every_s <= 0:
        raise ValueError(f"blocks must be >= {_PER_PUT} and every_s > 0, got {blocks} and "
                         f"{every_s}")
    try:
        return run_served(_run(blocks, block, every_s))
    finally:
        gc.unfreeze()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvstore bench-gc", description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=100_000, help="blocks stored (default 100,000)")
    p.add_argument("--block-bytes", type=int, default=1024,
                   help="payload bytes per block (default 1024: the heap, not the bytes, "
                        "is measured)")
    p.add_argument("--every-s", type=float, default=0.25,
                   help="the frozen run's server.gc_freeze_s (default 0.25, the server's)")
    p.add_argument("--json", help="write the results as JSON here")
    args = p.parse_args(argv)
    r = run(args.blocks, args.block_bytes, args.every_s)
    print(f"collections on the event loop while {args.blocks:,} blocks are stored "
          f"(load {r['load_average']}):")
    print("| server.gc_freeze_s | fill s | collections (full) | pause max ms | p99 ms | "
          "total ms | objects a full collection walks | a full collection then, ms |")
    print("|---|---|---|---|---|---|---|---|")
    for row in r["rows"]:
        print(f"| {row['gc_freeze_s']:g} | {row['fill_s']} | {row['collections']} "
              f"({row['full_collections']}) | {row['pause_max_ms']} | {row['pause_p99_ms']} | "
              f"{row['pause_total_ms']} | {row['walked_objects']:,} | "
              f"{row['full_collection_ms']} |")
    off, on = r["rows"]
    print(f"frozen / Python's own: longest pause "
          f"{on['pause_max_ms'] / max(off['pause_max_ms'], 1e-9):.3f}x, "
          f"time in collections {on['pause_total_ms'] / max(off['pause_total_ms'], 1e-9):.3f}x, "
          f"fill time {on['fill_s'] / max(off['fill_s'], 1e-9):.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0
