"""One load run: start the clients (threads, optionally in several processes),
sample the server's resident memory meanwhile, re-read every chain at the end,
and collect the server's failure counters. Returns a JSON-able result."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvstore.tools.harness import temporary_server
from kvstore.tools.loadtest.clients import Tally, run_clients
from kvstore.tools.loadtest.workload import LoadSpec, Workload, expected_payload, token_ids

__all__ = ["FAILURE_COUNTERS", "MemorySampler", "own_server", "run"]

#: Stats fields that count failures (0 in a healthy run, except where noted in the docs).
FAILURE_COUNTERS = ("corrupt_reads", "transfers_failed", "transfers_dropped", "events_dropped",
                    "demotions_failed", "orphans_dropped", "startup_skipped", "quarantined_slots")


class MemorySampler:
    """Samples ``/proc/PID/status`` (VmRSS, RssAnon, RssShmem) every ``interval`` s."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")
        self._t0 = time.monotonic()

    def _read(self) -> tuple[int, int, int] | None:
        fields: dict[str, int] = {}
        try:
            with open(f"/proc/{self.pid}/status") as fh:
                for line in fh:
                    name, _, value = line.partition(":")
                    if name in ("VmRSS", "RssAnon", "RssShmem"):
                        fields[name] = int(value.split()[0]) * 1024
        except (OSError, ValueError):
            return None
        return fields.get("VmRSS", 0), fields.get("RssAnon", 0), fields.get("RssShmem", 0)

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self._read()
            if got is not None:
                self.samples.append((time.monotonic() - self._t0, *got))
            self._stop.wait(self.interval)

    def __enter__(self) -> MemorySampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def summary(self) -> dict[str, Any]:
        """Start / end / peak RSS (MiB) and the trend of the second half: the least-squares
        slope (MiB per minute) and the growth it implies over that half."""
        mib = 2**20
        s = self.samples
        if len(s) < 4:
            return {"samples": len(s)}
        half = s[len(s) // 2:]
        ts = [p[0] for p in half]
        rss = [p[1] / mib for p in half]
        mt, mr = sum(ts) / len(ts), sum(rss) / len(rss)
        var = sum((t - mt) ** 2 for t in ts)
        slope = sum((t - mt) * (r - mr) for t, r in zip(ts, rss, strict=True)) / var if var else 0.0
        return {
            "samples": len(s),
            "start_mib": round(s[0][1] / mib, 1),
            "end_mib": round(s[-1][1] / mib, 1),
            "peak_mib": round(max(p[1] for p in s) / mib, 1),
            "anon_start_mib": round(s[0][2] / mib, 1),
            "anon_end_mib": round(s[-1][2] / mib, 1),
            "shmem_end_mib": round(s[-1][3] / mib, 1),
            "second_half_slope_mib_per_min": round(slope * 60, 2),
            "second_half_growth_mib": round(slope * (ts[-1] - ts[0]), 1),
            "second_half_range_mib": round(max(rss) - min(rss), 1),
            "series": [(round(t, 1), round(r / mib, 1)) for t, r, _a, _s in s],
        }


@contextmanager
def own_server(dram: str, disk: str, env: dict[str, str] | None = None
               ) -> Iterator[tuple[str, int, Path]]:
    """A ``kvstore serve`` process on a free loopback port with DRAM + disk tiers and
    a throwaway data dir; yields (address, pid, log path)."""
    full_env = {"KVSTORE_DRAM__CAPACITY": dram, "KVSTORE_DISK__CAPACITY": disk, **(env or {})}
    with temporary_server(full_env, prefix="kvstore-loadtest-") as server:
        yield server.address, server.pid, server.log_path


def _final_check(spec: LoadSpec, address: str) -> dict[str, int]:
    """Read every block of every chain over gRPC: each one stored must be intact."""
    from kvstore.client import KVStoreClient
    from kvstore.errors import NotFound

    wl = Workload(spec)
    out = {"verified": 0, "wrong": 0, "missing": 0}
    with KVStoreClient(address, timeout=spec.timeout, shared_memory=False) as c:
        for chain in wl.chains:
            try:
                got = c.get(chain.namespace, list(chain.hashes))
            except NotFound:
                out["missing"] += len(chain.hashes)
                continue
            for i, blk in enumerate(got):
                if blk is None:
                    out["missing"] += 1
                    continue
                h = chain.hashes[i]
                good = (bytes(blk.payload) == expected_payload(h, wl.size(h))
                        and tuple(blk.token_ids) == token_ids(h)
                        and (blk.parent_hash or None) == chain.parent(i))
                out["verified" if good else "wrong"] += 1
    return out


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _clients_per_process(spec: LoadSpec) -> list[list[int]]:
    return [list(range(p, spec.clients, spec.processes)) for p in range(spec.processes)]


def _run_clients(spec: LoadSpec, address: str) -> Tally:
    start_at = time.time() + (3.0 if spec.processes > 1 else 0.5)
    groups = _clients_per_process(spec)
    if spec.processes == 1:
        return run_clients(spec, address, groups[0], start_at)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    tally = Tally()
    with ProcessPoolExecutor(spec.processes,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(run_clients, spec, address, g, start_at) for g in groups]
        for f in futures:
            tally.merge(f.result())
    return tally


def _server_stats(address: str) -> dict[str, Any]:
    from kvstore.client import KVStoreClient

    with KVStoreClient(address, timeout=30, shared_memory=False) as c:
        st = c.stats()
    out: dict[str, Any] = {name: getattr(st, name, None) for name in FAILURE_COUNTERS}
    out["blocks"] = st.blocks
    out["tiers"] = {t.name: {"used_bytes": t.used_bytes, "capacity_bytes": t.capacity_bytes,
                             "blocks": t.blocks, "evictions": t.evictions} for t in st.tiers}
    return out


def run(spec: LoadSpec, address: str, server_pid: int | None = None) -> dict[str, Any]:
    """Run the load against ``address``; sample ``server_pid``'s memory if given."""
    spec.validate()
    t0 = time.monotonic()
    if server_pid is not None:
        with MemorySampler(server_pid) as sampler:
            tally = _run_clients(spec, address)
        memory: dict[str, Any] | None = sampler.summary()
    else:
        tally = _run_clients(spec, address)
        memory = None
    wall = time.monotonic() - t0
    ops: dict[str, Any] = {}
    for op in spec.mix:
        lat = sorted(tally.latencies.get(op, []))
        ops[op] = {
            "count": tally.ops[op], "per_s": round(tally.ops[op] / spec.seconds, 1),
            "p50_ms": round(_percentile(lat, 0.5) * 1e3, 2) if lat else None,
            "p99_ms": round(_percentile(lat, 0.99) * 1e3, 2) if lat else None,
            "verified_blocks": tally.verified[op], "wrong_blocks": tally.wrong[op],
            "missed_blocks": tally.missed[op], "blocks_put": tally.blocks_put[op],
            "refused": tally.refused[op], "not_found": tally.not_found[op],
        }
    return {
        "address": address,
        "spec": {**dataclasses.asdict(spec), "mix": dict(spec.mix)},
        "wall_s": round(wall, 1),
        "ops": ops,
        "total_ops": sum(tally.ops.values()),
        "wrong_blocks": sum(tally.wrong.values()),
        "verified_blocks": sum(tally.verified.values()),
        "refused": sum(tally.refused.values()),
        "unexpected_errors": sum(tally.unexpected.values()),
        "unexpected": dict(tally.unexpected),
        "samples": tally.samples,
        "final_check": _final_check(spec, address),
        "memory": memory,
        "server_stats": _server_stats(address),
    }
