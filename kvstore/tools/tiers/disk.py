"""Disk tier put / get next to raw direct I/O of the same block size, in the same run.

    kvstore bench-tiers disk [--block-mib 1] [--blocks 256] [--repeats 3]
                                       [--qd 8] [--dir DIR]

Baseline: ``fio`` (direct I/O, libaio, the same block size, queue depth 1 and
``--qd``; writes end with an fsync and go to a new file each time, so they
allocate blocks as the tier's new segments do) when it is installed, else ``dd`` with
``oflag=direct`` / ``iflag=direct`` (queue depth 1). With fio, one more write
line has the tier's durability: an ``fdatasync`` after every batch of blocks
(as many as one 8 MiB group commit holds), queue depth 1. Each repeat runs baseline
write, tier put, baseline read, tier get, one after the other, so load from
other processes hits all alike; medians are printed.

The tier puts ``--blocks`` blocks with ``put_many`` (group commit: one write and
one fdatasync per batch; every put returns once durable) and reads them back
with ``get_many`` (``--qd`` reads in flight, each payload checksum verified).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from kvstore.tiers.disk import DiskTier
from kvstore.types import BlockKey, BlockMeta

__all__ = ["main", "raw_read", "raw_write"]


def _fio(path: Path, rw: str, block: int, total: int, qd: int, sync_every: int = 0) -> float:
    cmd = ["fio", "--name=kvbench", f"--filename={path}", f"--size={total}", f"--bs={block}",
           f"--rw={rw}", "--direct=1", "--output-format=json", "--allow_file_create=1"]
    if sync_every:  # the tier's durability: an fdatasync after every batch of writes
        cmd += ["--ioengine=psync", f"--fdatasync={sync_every}"]
    else:
        cmd += ["--ioengine=libaio", f"--iodepth={qd}"]
    if rw == "write":
        cmd.append("--end_fsync=1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    job = json.loads(out.stdout)["jobs"][0]
    return float(job["write" if rw == "write" else "read"]["bw_bytes"]) / 1e9


def _dd(path: Path, rw: str, block: int, total: int) -> float:
    count = total // block
    if rw == "write":
        cmd = ["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={count}",
               "oflag=direct", "conv=fsync"]
    else:
        cmd = ["dd", f"if={path}", "of=/dev/null", f"bs={block}", f"count={count}", "iflag=direct"]
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, timeout=600, check=True)
    return total / (time.perf_counter() - t0) / 1e9


def raw_write(path: Path, block: int, total: int, qd: int) -> float:
    return _fio(path, "write", block, total, qd) if shutil.which("fio") else _dd(
        path, "write", block, total)


def raw_read(path: Path, block: int, total: int, qd: int) -> float:
    return _fio(path, "read", block, total, qd) if shutil.which("fio") else _dd(
        path, "read", block, total)


def _metas(n: int, size: int, run: int) -> list[BlockMeta]:
    return [BlockMeta(BlockKey("bench", (run << 32 | i).to_bytes(32, "big")), None,
                      tuple(range(16)), size, 0) for i in range(n)]


async def _tier_round(root: Path, data: bytes, blocks: int, qd: int, run: int
                      ) -> tuple[float, float, float]:
    total = len(data) * blocks
    # Sized like the server's default disk tier (10 GiB: 256 MiB segments); capacity is
    # logical, only the segments written are allocated.
    tier = DiskTier(root, max(2 * total, 10 << 30), io_threads=qd)
    metas = _metas(blocks, len(data), run)
    try:
        t0 = time.perf_counter()
        await tier.put_many([(m, data) for m in metas])
        put = total / (time.perf_counter() - t0) / 1e9
        per_sync = tier._writer.blocks / max(tier._writer.batches, 1)
        t0 = time.perf_counter()
        got = await tier.get_many([m.key for m in metas])
        get = total / (time.perf_counter() - t0) / 1e9
        assert all(len(g) == len(data) for g in got)
    finally:
        await tier.close()
    return put, get, per_sync


async def run(block: int, blocks: int, repeats: int, qd: int, base: Path) -> dict[str, float]:
    data = np.random.default_rng(0).integers(0, 255, block, dtype=np.uint8).tobytes()
    total = block * blocks
    rates: dict[str, list[float]] = {}
    tool = "fio" if shutil.which("fio") else "dd"
    for r in range(repeats):
        raw = base / f"raw-{r}"

        def fresh_write(name: str, qd: int, sync_every: int = 0, raw: Path = raw) -> None:
            raw.unlink(missing_ok=True)  # every raw write allocates, as a new segment does
            rate = (_fio(raw, "write", block, total, qd, sync_every) if tool == "fio"
                    else _dd(raw, "write", block, total))
            rates.setdefault(name, []).append(rate)

        fresh_write(f"{tool} direct write, qd 1", 1)
        if tool == "fio":
            fresh_write(f"fio direct write, qd {qd}", qd)
            every = max(1, (8 << 20) // (block + 4096))
            fresh_write(f"fio direct write + fdatasync per {every}", 1, every)
        tier_root = base / f"tier-{r}"
        put, get, per_sync = await _tier_round(tier_root, data, blocks, qd, r)
        rates.setdefault("tier put_many (durable)", []).append(put)
        rates.setdefault("blocks per fdatasync", []).append(per_sync)
        rates.setdefault(f"{tool} direct read, qd 1", []).append(raw_read(raw, block, total, 1))
        if tool == "fio":
            rates.setdefault(f"fio direct read, qd {qd}", []).append(
                raw_read(raw, block, total, qd))
        rates.setdefault(f"tier get_many (qd {qd}, verified)", []).append(get)
        raw.unlink()
        shutil.rmtree(tier_root, ignore_errors=True)
    return {name: statistics.median(v) for name, v in rates.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvstore bench-tiers disk", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block-mib", type=float, default=1.0)
    p.add_argument("--blocks", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--qd", type=int, default=8, help="reads in flight; fio queue depth")
    p.add_argument("--dir", type=Path, default=None, help="a directory on the disk to measure")
    args = p.parse_args(argv)
    block = int(args.block_mib * (1 << 20))
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="kvbench-") as tmp:
        res = asyncio.run(run(block, args.blocks, args.repeats, args.qd, Path(tmp)))
    print(f"block {block} bytes x {args.blocks} blocks, median of {args.repeats}")
    writes = [v for k, v in res.items() if "direct write" in k and "fdatasync" not in k]
    reads = [v for k, v in res.items() if "direct read" in k]
    for name, value in res.items():
        if name == "blocks per fdatasync":
            print(f"{name:<40} {value:7.1f}")
            continue
        line = f"{name:<40} {value:7.2f} GB/s"
        if name.startswith("tier put"):
            line += "   " + "  ".join(f"{value / w:4.2f}x" for w in writes) + " of raw writes"
        elif name.startswith("tier get"):
            line += "   " + "  ".join(f"{value / r:4.2f}x" for r in reads) + " of raw reads"
        print(line)


if __name__ == "__main__":
    main()
