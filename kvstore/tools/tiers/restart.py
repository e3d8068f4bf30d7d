"""Disk tier restart time and index memory with many small blocks.

    kvstore bench-tiers restart [--blocks 1000000] [--block-bytes 1024] [--dir DIR]

Fills a disk tier with ``--blocks`` blocks (16 token ids each, as vLLM's
16-token blocks carry), closes it, drops the page cache when it may (root), then
in a fresh process opens the tier and times ``recover()`` (every block's
metadata back, index built), and reports resident memory before, with the
returned metadata, and after dropping it (the index alone). It then removes one
segment's footer (what a crash leaves) and times the restart that scans it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstore.tiers.disk import DiskTier

__all__ = ["main"]


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def _fill(root: Path, blocks: int, size: int) -> float:
    from kvstore.tiers.disk import DiskTier
    from kvstore.types import BlockKey, BlockMeta

    payload = bytes(range(256)) * (size // 256 + 1)
    payload = payload[:size]
    tier = DiskTier(root, max(blocks * size * 2, 1 << 30))
    t0 = time.perf_counter()
    step = 8192
    for start in range(0, blocks, step):
        items = [(BlockMeta(BlockKey("bench", i.to_bytes(32, "big")), None,
                            tuple(range(i % 1000, i % 1000 + 16)), size, 0), payload)
                 for i in range(start, min(start + step, blocks))]
        await tier.put_many(items)
    await tier.close()
    return time.perf_counter() - t0


async def _restart(root: Path) -> dict[str, float]:
    from kvstore.tiers.disk import DiskTier

    gc.collect()
    before = _rss()
    tier = DiskTier(root, 1 << 40)
    t0 = time.perf_counter()
    metas = await tier.recover()
    seconds = time.perf_counter() - t0
    with_metas = _rss()
    n = len(metas)
    del metas
    gc.collect()
    index_only = _rss()
    out = {"blocks": n, "seconds": seconds, "rss_before": before, "rss_with_metas": with_metas,
           "rss_index": index_only, "scanned": tier.report.scanned if tier.report else 0,
           "index_bytes_estimate": _index_bytes(tier)}
    await tier.close()
    return out


def _index_bytes(tier: DiskTier) -> int:
    m = tier._map
    return sys.getsizeof(m) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in m.items())


def _drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _child(root: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "kvstore.tools.tiers.restart", "--child",
                          str(root)], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvstore bench-tiers restart", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=1_000_000)
    p.add_argument("--block-bytes", type=int, default=1024)
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(asyncio.run(_restart(args.child))))
        return
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="kvrestart-") as tmp:
        root = Path(tmp) / "disk"
        fill = asyncio.run(_fill(root, args.blocks, args.block_bytes))
        disk = sum(f.stat().st_blocks * 512 for f in root.iterdir())
        print(f"filled {args.blocks} blocks of {args.block_bytes} bytes in {fill:.1f}s "
              f"({args.blocks / fill:,.0f} puts/s); {disk / 2**30:.2f} GiB on disk in "
              f"{len(list(root.glob('*.seg')))} segments")
        cold = _drop_caches()
        res = _child(root)
        n = res["blocks"]
        print(f"restart ({'page cache dropped' if cold else 'warm page cache'}): {n:,.0f} "
              f"blocks in {res['seconds']:.2f}s ({n / res['seconds']:,.0f} blocks/s; "
              f"1,000,000 blocks: {res['seconds'] * 1e6 / n:.2f}s)")
        print(f"resident memory: {res['rss_before'] / 2**20:.0f} MiB before, "
              f"{res['rss_with_metas'] / 2**20:.0f} MiB holding every BlockMeta "
              f"({(res['rss_with_metas'] - res['rss_before']) / n:.0f} B/block), "
              f"{res['rss_index'] / 2**20:.0f} MiB with the index alone "
              f"({(res['rss_index'] - res['rss_before']) / n:.0f} B/block; dict + ints "
              f"{res['index_bytes_estimate'] / n:.0f} B/block)")
        last = max(root.glob("*.idx"))
        last.unlink()
        _drop_caches()
        res = _child(root)
        print(f"restart after a crash (segment {last.stem} without footer, scanned): "
              f"{res['seconds']:.2f}s, {res['scanned']:.0f} segment scanned")


if __name__ == "__main__":
    main()
