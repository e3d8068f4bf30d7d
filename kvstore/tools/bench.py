"""``kvstore bench``: data-plane throughput and lookup latency, with baselines.

Starts a real ``kvstore serve`` (DRAM only, so disk write-back does not compete;
:func:`kvstore.tools.harness.dram_only_server`)
unless ``--address`` points at a running one, then puts and gets blocks through
the shared-memory plane and through gRPC streaming and prints GB/s next to a
plain memcpy of the same bytes measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from kvstore.tools.harness import dram_only_server
from kvstore.tools.measure import make_blocks, measure

__all__ = ["add_parser", "run"]


def _memcpy_gbps(size: int, n: int, repeats: int = 5) -> float:
    src = [np.frombuffer(np.random.default_rng(0).bytes(size), np.uint8) for _ in range(n)]
    dst = np.empty(size * n, np.uint8)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for i, s in enumerate(src):
            np.copyto(dst[i * size:(i + 1) * size], s)
        best = min(best, time.perf_counter() - t)
    return size * n / best / 1e9


def run(address: str, total_bytes: int, repeats: int) -> dict[str, Any]:
    from kvstore.client import KVStoreClient

    results: dict[str, Any] = {"address": address, "rows": []}
    for size in (2**20, 64 * 2**10):
        n = max(16, total_bytes // size)
        memcpy = _memcpy_gbps(size, n)
        for path in ("shm", "grpc"):
            t = measure(address, path, size, n, repeats if path == "shm" else 2)
            row: dict[str, Any] = {"block": size, "blocks": n, "path": path,
                                   "memcpy_gbps": round(memcpy, 2)}
            for op, seconds in t.items():
                gbps = n * size / seconds / 1e9
                row[f"{op}_gbps"] = round(gbps, 2)
                row[f"{op}_vs_memcpy"] = round(gbps / memcpy, 3)
            results["rows"].append(row)
    # Lookup latency: 1,000 hashes, all stored.
    with KVStoreClient(address) as c:
        blocks = make_blocks(1000, 4096, seed=3)
        c.put("bench-lookup", blocks)
        hashes = [b.block_hash for b in blocks]
        lat: list[float] = []
        for _ in range(300):
            t0 = time.perf_counter()
            r = c.lookup("bench-lookup", hashes)
            lat.append(time.perf_counter() - t0)
            if r.num_hit != 1000:
                raise RuntimeError(f"lookup found {r.num_hit} of 1000")
        lat.sort()
        results["lookup_1000"] = {
            "p50_ms": round(statistics.median(lat) * 1e3, 3),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 3),
        }
        c.delete("bench-lookup")
    # The live profile's hook runs inside every Lookup: its share of one, same hashes.
    from kvstore.profile.live import LiveProfile

    live = LiveProfile()
    live.on_lookup("bench-lookup", hashes)
    hook: list[float] = []
    for _ in range(300):
        t0 = time.perf_counter()
        live.on_lookup("bench-lookup", hashes)
        hook.append(time.perf_counter() - t0)
    p50 = statistics.median(hook)
    results["lookup_1000"]["profile_hook_p50_ms"] = round(p50 * 1e3, 3)
    results["lookup_1000"]["profile_hook_share"] = round(p50 / statistics.median(lat), 3)
    return results


def _print(results: dict[str, Any]) -> None:
    print(f"{'block':>8} {'path':>5} {'memcpy':>7} | {'put':>6} {'x memcpy':>8} | "
          f"{'get':>6} {'x memcpy':>8} | {'get_into':>8} {'x memcpy':>8}   (GB/s)")
    for r in results["rows"]:
        blk = f"{r['block'] // 1024} KiB" if r["block"] < 2**20 else f"{r['block'] // 2**20} MiB"
        print(f"{blk:>8} {r['path']:>5} {r['memcpy_gbps']:>7.2f} | {r['put_gbps']:>6.2f} "
              f"{r['put_vs_memcpy']:>8.1%} | {r['get_gbps']:>6.2f} {r['get_vs_memcpy']:>8.1%} | "
              f"{r['get_into_gbps']:>8.2f} {r['get_into_vs_memcpy']:>8.1%}")
    lk = results["lookup_1000"]
    print(f"lookup of 1,000 hashes: p50 {lk['p50_ms']:.3f} ms, p99 {lk['p99_ms']:.3f} ms; "
          f"live-profile hook p50 {lk['profile_hook_p50_ms']:.3f} ms "
          f"({lk['profile_hook_share']:.1%} of the lookup)")


def _main(args: argparse.Namespace) -> int:
    total = int(args.mib * 2**20)
    if args.tls:
        from kvstore.tools import bench_tls as tls_bench

        results = tls_bench.run(total, args.repeats)
        tls_bench.print_results(results)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        return 0
    if args.address:
        results = run(args.address, total, args.repeats)
    else:
        with dram_only_server(f"{max(512, int(args.mib * 3))}MiB") as address:
            results = run(address, total, args.repeats)
    _print(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="data-plane throughput vs memcpy; lookup latency")
    p.add_argument("--address", help="bench a running server instead of starting one")
    p.add_argument("--mib", type=float, default=256, help="bytes per run, MiB (default 256)")
    p.add_argument("--repeats", type=int, default=5, help="best of N runs (default 5)")
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--tls", action="store_true",
                   help="gRPC put/get over TLS vs plaintext (two local servers, openssl-made "
                        "certificates); prints the ratio")
    p.set_defaults(func=_main)
