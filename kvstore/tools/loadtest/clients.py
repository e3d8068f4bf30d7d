"""The load test's clients: each thread owns two ``KVStoreClient``s (one that uses
shared memory, one gRPC only), draws operations from the workload until the
deadline, times each, and checks every block it reads against the bytes derived
from its hash. Errors are classified, never raised: RESOURCE_EXHAUSTED (a tier
full of pinned or in-flight blocks) is an expected refusal, NOT_FOUND (a
namespace emptied by deletes) an expected miss, anything else is unexpected."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvstore.tools.loadtest.workload import (
    Chain,
    LoadSpec,
    Workload,
    expected_payload,
    token_ids,
)

__all__ = ["Tally", "run_clients"]

_SAMPLES = 10


@dataclass
class Tally:
    """What some clients did; merged across threads and processes."""

    ops: Counter[str] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    #: Blocks read and checked, per operation (good ones).
    verified: Counter[str] = field(default_factory=Counter)
    #: Blocks read whose bytes (or header) differ from what was written.
    wrong: Counter[str] = field(default_factory=Counter)
    #: Blocks asked for and not returned (never stored, evicted, deleted).
    missed: Counter[str] = field(default_factory=Counter)
    blocks_put: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    not_found: Counter[str] = field(default_factory=Counter)
    #: "op: ErrorClass" -> count.
    unexpected: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)

    def sample(self, text: str) -> None:
        if len(self.samples) < _SAMPLES:
            self.samples.append(text)

    def merge(self, other: Tally) -> None:
        for name in ("ops", "verified", "wrong", "missed", "blocks_put", "refused",
                     "not_found", "unexpected"):
            getattr(self, name).update(getattr(other, name))
        for op, lat in other.latencies.items():
            self.latencies.setdefault(op, []).extend(lat)
        self.samples.extend(other.samples[:max(0, _SAMPLES - len(self.samples))])


class _Client:
    """One simulated client: its clients, its buffer, its random stream."""

    def __init__(self, wl: Workload, address: str, client_id: int, tally: Tally) -> None:
        from kvstore.client import KVStoreClient

        spec = wl.spec
        self.wl = wl
        self.tally = tally
        self.rng = random.Random(spec.seed * 1_000_003 + client_id)
        self.shm = KVStoreClient(address, timeout=spec.timeout)
        self.grpc = KVStoreClient(address, timeout=spec.timeout, shared_memory=False)
        self.buf = bytearray(wl.max_bytes())
        self.zeros = bytes(len(self.buf))

    def close(self) -> None:
        self.shm.close()
        self.grpc.close()

    # -- checks ---------------------------------------------------------------------
    def _check(self, op: str, chain: Chain, i: int, payload: Any, parent: Any = None,
               tokens: Sequence[int] | None = None) -> None:
        h = chain.hashes[i]
        want = expected_payload(h, self.wl.size(h))
        ok = bytes(payload) == want
        if ok and tokens is not None:
            ok = (parent or None) == chain.parent(i) and tuple(tokens) == token_ids(h)
        if ok:
            self.tally.verified[op] += 1
            return
        self.tally.wrong[op] += 1
        self.tally.sample(f"{op}: WRONG BYTES for {chain.namespace}/{h.hex()[:16]} "
                          f"(block {i}): {len(payload)} bytes read, {len(want)} written")

    def _check_blocks(self, op: str, chain: Chain, got: Sequence[Any]) -> None:
        for i, blk in enumerate(got):
            if blk is None:
                self.tally.missed[op] += 1
            elif bytes(blk.block_hash) != chain.hashes[i]:
                self.tally.wrong[op] += 1
                self.tally.sample(f"{op}: block {i} of {chain.namespace} came back with hash "
                                  f"{bytes(blk.block_hash).hex()[:16]}")
            else:
                self._check(op, chain, i, blk.payload, blk.parent_hash, blk.token_ids)

    # -- operations -----------------------------------------------------------------
    def _blocks(self, chain: Chain, n: int) -> list[Any]:
        from kvstore.types import BlockData

        return [BlockData(h, chain.parent(i), token_ids(h), expected_payload(h, self.wl.size(h)))
                for i, h in enumerate(chain.hashes[:n])]

    def run_op(self, op: str, chain: Chain, n: int) -> None:
        ns, hashes = chain.namespace, chain.hashes[:n]
        if op in ("put_shm", "put_grpc"):
            client = self.shm if op == "put_shm" else self.grpc
            self.tally.blocks_put[op] += client.put(ns, self._blocks(chain, n))
        elif op == "lookup":
            self.shm.lookup(ns, hashes)
        elif op in ("get_shm", "get_grpc"):
            client = self.shm if op == "get_shm" else self.grpc
            self._check_blocks(op, chain, client.get(ns, hashes))
        elif op == "get_into":
            sizes = [self.wl.size(h) for h in hashes]
            mv = memoryview(self.buf)
            total = sum(sizes)
            mv[:total] = memoryview(self.zeros)[:total]  # nothing stale can pass the check
            views, off = [], 0
            for s in sizes:
                views.append(mv[off:off + s])
                off += s
            got = self.shm.get_into(ns, hashes, views)
            for i, (want, n_read) in enumerate(zip(sizes, got, strict=True)):
                if n_read == 0:
                    self.tally.missed[op] += 1
                elif n_read != want:
                    self.tally.wrong[op] += 1
                    self.tally.sample(f"get_into: block {i} of {ns}: {n_read} bytes, "
                                      f"{want} written")
                else:
                    self._check(op, chain, i, views[i])
            for v in views:
                v.release()
            mv.release()
        elif op == "delete":
            start = max(chain.shared, n - 1)
            if start < len(chain.hashes):
                self.shm.delete(ns, chain.hashes[start:])
        else:  # pragma: no cover - the spec is validated
            raise ValueError(op)

    def loop(self, deadline: float) -> None:
        from kvstore.errors import KVStoreError, NotFound, ResourceExhausted

        tally = self.tally
        while time.monotonic() < deadline:
            op, chain, n = self.wl.draw(self.rng)
            t0 = time.perf_counter()
            try:
                self.run_op(op, chain, n)
            except ResourceExhausted:
                tally.refused[op] += 1
                continue
            except NotFound:
                tally.not_found[op] += 1
                continue
            except (KVStoreError, Exception) as exc:  # noqa: BLE001 - classified, reported
                tally.unexpected[f"{op}: {type(exc).__name__}"] += 1
                tally.sample(f"{op}: {type(exc).__name__}: {exc}")
                continue
            tally.ops[op] += 1
            tally.latencies.setdefault(op, []).append(time.perf_counter() - t0)


def run_clients(spec: LoadSpec, address: str, client_ids: Sequence[int], start_at: float,
                ) -> Tally:
    """Run ``client_ids`` as threads of this process from ``start_at`` (time.time) for
    ``spec.seconds``; returns their merged tally."""
    wl = Workload(spec)
    tallies = [Tally() for _ in client_ids]
    clients: list[_Client] = []
    try:
        for cid, tally in zip(client_ids, tallies, strict=True):
            clients.append(_Client(wl, address, cid, tally))
        delay = max(0.0, start_at - time.time())
        deadline = time.monotonic() + delay + spec.seconds
        time.sleep(delay)
        threads = [threading.Thread(target=c.loop, args=(deadline,), daemon=True,
                                    name=f"loadtest-{cid}")
                   for c, cid in zip(clients, client_ids, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()
    out = Tally()
    for tally in tallies:
        out.merge(tally)
    return out
