"""DRAM tier put / get next to a plain memcpy in the same process.

    kvstore bench-tiers dram [--block-mib 1] [--blocks 256] [--repeats 5]

memcpy (numpy ``copyto`` into a pre-faulted shared-memory segment) and the warm
tier alternate within each repeat, so load from other processes hits both
alike; GB/s are medians, with each ratio to memcpy. A put into a segment that
was not pre-faulted is measured once, to show why the pool is pre-faulted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from functools import partial

import numpy as np

from kvstore.tiers.dram import DramTier
from kvstore.tiers.shm import create_segment, destroy_segment, segment_name
from kvstore.types import BlockKey, BlockMeta

__all__ = ["main"]


def _metas(n: int, size: int) -> list[BlockMeta]:
    return [
        BlockMeta(BlockKey("bench", i.to_bytes(32, "big")), None, (), size, 0) for i in range(n)
    ]


async def _timed(fn: Callable[[], Awaitable[object]], nbytes: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        await fn()
        rates.append(nbytes / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


async def _put_all(tier: DramTier, metas: list[BlockMeta], data: bytes) -> None:
    await tier.put_many([(m, data) for m in metas])


async def _get_copy(tier: DramTier, metas: list[BlockMeta], dst: np.ndarray) -> None:
    for m in metas:
        view = await tier.get(m.key)
        np.copyto(dst[: len(view)], np.frombuffer(view, dtype=np.uint8))
        view.release()


async def _memcpy(dst: np.ndarray, src: np.ndarray, blocks: int) -> None:
    block = len(src)
    for i in range(blocks):
        np.copyto(dst[i * block : (i + 1) * block], src)


async def run(block: int, blocks: int, repeats: int) -> dict[str, float]:
    src = np.random.default_rng(0).integers(0, 255, block, dtype=np.uint8)
    data = src.tobytes()
    total = block * blocks
    metas = _metas(blocks, block)
    out: dict[str, float] = {}

    # memcpy and the warm DRAM tier alternate within each repeat, so load from
    # other processes on the machine hits both alike.
    shm = create_segment(segment_name("kvbench", 0), total)
    warm = DramTier(total, segment_prefix="kvbench")
    out_buf = np.empty(block, dtype=np.uint8)
    rates: dict[str, list[float]] = {}
    try:
        dst = np.frombuffer(shm.buf, dtype=np.uint8)  # type: ignore[arg-type]
        await _put_all(warm, metas, data)  # first pass allocates the slots
        for _ in range(repeats):
            for name, fn in (
                ("memcpy (numpy copyto, pre-faulted shm)", partial(_memcpy, dst, src, blocks)),
                ("dram put, warm (pre-faulted, replacing)", partial(_put_all, warm, metas, data)),
                ("dram get + copy out", partial(_get_copy, warm, metas, out_buf)),
            ):
                rates.setdefault(name, []).append(await _timed(fn, total, 1))
        del dst
    finally:
        destroy_segment(shm)
        await warm.close()
    out.update({name: statistics.median(r) for name, r in rates.items()})

    cold = DramTier(total, segment_prefix="kvbench", prefault=False)
    out["dram put, first touch (not pre-faulted)"] = await _timed(
        lambda: _put_all(cold, metas, data), total, 1
    )
    await cold.close()

    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvstore bench-tiers dram", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block-mib", type=float, default=1.0)
    p.add_argument("--blocks", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    block = int(args.block_mib * (1 << 20))
    res = asyncio.run(run(block, args.blocks, args.repeats))
    base = next(iter(res.values()))
    print(f"block {block} bytes x {args.blocks} blocks, median of {args.repeats}")
    for name, gbs in res.items():
        print(f"{name:<52} {gbs:7.2f} GB/s   {gbs / base:5.2f}x memcpy")


if __name__ == "__main__":
    main()
