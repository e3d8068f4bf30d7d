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
from collections.abc import Sequence
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


def _storm_writer(address: str, stop: Any, block: int, blocks: int) -> None:
    """Save as fast as one client can: ``blocks`` blocks of ``block`` bytes, put and
    deleted again and again (in its own process: its copies do not hold our GIL)."""
    from kvstore.client import KVStoreClient

    data = make_blocks(blocks, block, seed=7)
    with KVStoreClient(address) as c:
        i = 0
        while not stop.is_set():
            ns = f"bench-storm-{i % 2}"
            c.put(ns, data)
            c.delete(ns)
            i += 1


def _loop_lag(address: str, window_s: float) -> dict[str, float] | None:
    """The server's event-loop lag over the last ``window_s`` (None: not reported)."""
    import grpc

    from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
    from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as ch:
        st = pb_grpc.KVStoreStub(ch).Stats(pb.StatsRequest(loop_lag_window_s=window_s))
    if not st.HasField("loop_lag") or not st.loop_lag.samples:
        return None
    lag = st.loop_lag
    out = {"samples": lag.samples, "p50_ms": round(lag.p50_ms, 3),
           "p99_ms": round(lag.p99_ms, 3), "max_ms": round(lag.max_ms, 3)}
    if lag.busy_samples:  # (a server before the busy sampler reports none)
        out.update(busy_p50_ms=round(lag.busy_p50_ms, 3), busy_p99_ms=round(lag.busy_p99_ms, 3),
                   busy_max_ms=round(lag.busy_max_ms, 3))
    return out


def _save_storm(address: str, hashes: list[bytes], seconds: float) -> dict[str, Any]:
    """Lookups of the 1,000 stored hashes while another process saves 1 MiB blocks
    without pause; the server's loop lag over the same seconds, and before them."""
    import multiprocessing

    from kvstore.client import KVStoreClient

    quiet = _loop_lag(address, 2.0)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    writer = ctx.Process(target=_storm_writer, args=(address, stop, 2**20, 32), daemon=True)
    writer.start()
    lat: list[float] = []
    try:
        with KVStoreClient(address) as c:
            time.sleep(1.0)  # the writer's start (imports, its first put)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                c.lookup("bench-lookup", hashes)
                lat.append(time.perf_counter() - t0)
                time.sleep(0.002)
        lag = _loop_lag(address, seconds)
    finally:
        stop.set()
        writer.join(30)
        if writer.is_alive():
            writer.kill()
    lat.sort()
    return {"seconds": seconds, "lookups": len(lat),
            "lookup_p50_ms": round(statistics.median(lat) * 1e3, 3),
            "lookup_p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 3),
            "loop_lag": lag, "loop_lag_quiet": quiet}


def run(address: str, total_bytes: int, repeats: int, storm_s: float = 5.0,
        block_sizes: Sequence[int] = (2**20, 64 * 2**10)) -> dict[str, Any]:
    from kvstore.client import KVStoreClient

    results: dict[str, Any] = {"address": address, "rows": []}
    for size in block_sizes:
        n = max(16, total_bytes // size)
        memcpy = _memcpy_gbps(size, n)
        for path in ("shm", "grpc"):
            rounds: dict[str, list[float]] = {}
            t = measure(address, path, size, n, repeats if path == "shm" else 2,
                        rounds=rounds)
            row: dict[str, Any] = {"block": size, "blocks": n, "path": path,
                                   "memcpy_gbps": round(memcpy, 2)}
            for op, seconds in t.items():
                gbps = n * size / seconds / 1e9
                row[f"{op}_gbps"] = round(gbps, 2)
                row[f"{op}_vs_memcpy"] = round(gbps / memcpy, 3)
                # (the median round: the best one flatters a shared machine's lulls)
                median = n * size / statistics.median(rounds[op]) / 1e9
                row[f"{op}_median_vs_memcpy"] = round(median / memcpy, 3)
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
        # The same lookup asked again for one waiting request (vLLM's scheduler asks on
        # every step it waits; the connector keeps the answer, so this is what a step
        # that does ask costs): the server counts it once and answers from its plan.
        again: list[float] = []
        c.lookup("bench-lookup", hashes, request_id="bench-waiting")
        for _ in range(300):
            t0 = time.perf_counter()
            r = c.lookup("bench-lookup", hashes, request_id="bench-waiting")
            again.append(time.perf_counter() - t0)
            if r.num_hit != 1000:
                raise RuntimeError(f"a repeated lookup found {r.num_hit} of 1000")
        again.sort()
        results["lookup_1000"] = {
            "p50_ms": round(statistics.median(lat) * 1e3, 3),
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 3),
            "repeat_p50_ms": round(statistics.median(again) * 1e3, 3),
            "repeat_p99_ms": round(again[int(len(again) * 0.99)] * 1e3, 3),
        }
        results["storm"] = _save_storm(address, hashes, storm_s)
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
        if r["path"] == "shm":
            print(f"{'':>14} the median round: put {r['put_median_vs_memcpy']:.1%}, get "
                  f"{r['get_median_vs_memcpy']:.1%}, get_into "
                  f"{r['get_into_median_vs_memcpy']:.1%} of memcpy")
    lk = results["lookup_1000"]
    print(f"lookup of 1,000 hashes: p50 {lk['p50_ms']:.3f} ms, p99 {lk['p99_ms']:.3f} ms; "
          f"live-profile hook p50 {lk['profile_hook_p50_ms']:.3f} ms "
          f"({lk['profile_hook_share']:.1%} of the lookup)")
    print(f"  the same asked again for one waiting request (request_id): p50 "
          f"{lk['repeat_p50_ms']:.3f} ms, p99 {lk['repeat_p99_ms']:.3f} ms")
    st = results["storm"]

    def lag(d: dict[str, float] | None) -> str:
        if not d:
            return "not reported by this server"
        out = (f"timer p50 {d['p50_ms']:.3f} ms, p99 {d['p99_ms']:.3f} ms, "
               f"max {d['max_ms']:.3f} ms")
        if "busy_p99_ms" in d:
            out += (f"; busy p50 {d['busy_p50_ms']:.3f} ms, p99 {d['busy_p99_ms']:.3f} ms, "
                    f"max {d['busy_max_ms']:.3f} ms")
        return out

    print(f"under a save storm ({st['seconds']:.0f} s, 32 x 1 MiB puts back to back from "
          f"another process): lookup p50 {st['lookup_p50_ms']:.3f} ms, "
          f"p99 {st['lookup_p99_ms']:.3f} ms; server loop lag {lag(st['loop_lag'])} "
          f"(quiet: {lag(st['loop_lag_quiet'])})")


def _main(args: argparse.Namespace) -> int:
    total = int(args.mib * 2**20)
    if args.tls:
        from kvstore.tools import bench_tls as tls_bench

        results = tls_bench.run(total, args.repeats)
        tls_bench.print_results(results)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        return 0
    sizes = [int(k * 1024) for k in args.block_kib] if args.block_kib else [2**20, 64 * 2**10]
    if any(s < 1 for s in sizes):
        raise SystemExit(f"kvstore bench: --block-kib must be > 0, got {args.block_kib}")
    if args.address:
        results = run(args.address, total, args.repeats, args.storm_s, sizes)
    else:
        with dram_only_server(f"{max(512, int(args.mib * 3))}MiB") as address:
            results = run(address, total, args.repeats, args.storm_s, sizes)
    _print(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="data-plane throughput vs memcpy; lookup latency")
    p.add_argument("--address", help="bench a running server instead of starting one")
    p.add_argument("--mib", type=float, default=256, help="bytes per run, MiB (default 256)")
    p.add_argument("--repeats", type=int, default=5,
                   help="best of N runs, after one that is not timed (default 5)")
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--block-kib", type=float, action="append",
                   help="block size to time, KiB (repeatable; default 1024 and 64)")
    p.add_argument("--storm-s", type=float, default=5.0,
                   help="seconds of the save storm (lookups and loop lag under it)")
    p.add_argument("--tls", action="store_true",
                   help="gRPC put/get over TLS vs plaintext (two local servers, openssl-made "
                        "certificates); prints the ratio")
    p.set_defaults(func=_main)
