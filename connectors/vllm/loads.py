"""Loads: payloads checked where they lie and copied once into the KV cache.

One ``Acquire`` leases every block a step loads; while the lease holds, the
payloads are read in the sidecar's shared-memory slots themselves
(``get_in_place``): each header is checked (namespace and layout digest,
block hash, length), each slot is checked once against the checksum the
sidecar recorded from the save's commit and returned with the slot (one xxh3
pass per loaded byte; the client does not check again: ``verify=False``), and
the lease is released. Into host KV tensors whose blocks are runs of bytes the
check is fused with the copy: each layer's row is hashed in the KV tensor right
after it is copied there, while it is in the cache, so each byte is read from
memory once (:meth:`HostKV.from_slots_checked`; the blocks split between the
calling thread and the checksum helpers); elsewhere a helper hashes each slot
while the calling thread copies it.
A slot that fails is reported to the sidecar, which drops that copy. Nothing is copied on the
way: the host backend copies slot -> KV tensor (:class:`DirectLoad`), a
device backend slot -> pinned staging -> device, layer by layer, on its own
stream and thread so the forward of early layers overlaps the copies of
later ones (:class:`LayerwiseLoad`).

A block whose payload is missing, foreign or corrupt fails, and so do the
blocks after it in its request: vLLM recomputes from the first failed block
(``kv_load_failure_policy="recompute"``). Bytes copied before a checksum
failed are overwritten by that recompute before anything reads them as a
cache hit, and the step that read them is replayed by the engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from kvstore.connectors.vllm import threads as conn_threads
from kvstore.connectors.vllm.payload import (
    HEADER_SIZE,
    PayloadError,
    check_header,
    slot_matches,
)
from kvstore.connectors.vllm.rows import SlotArrays

from kvstore.errors import KVStoreError

if TYPE_CHECKING:
    from kvstore.connectors.vllm.devicekv import DeviceKV, StagedLoad
    from kvstore.connectors.vllm.hostkv import HostKV
    from kvstore.connectors.vllm.sidecar import SidecarLink

    from kvstore.client import LeaseRead, SlotBuffer

__all__ = ["Checker", "DirectLoad", "LayerwiseLoad", "LoadJob"]

logger = logging.getLogger("kvstore.connectors.vllm")

Batch = Sequence[tuple[int, "SlotBuffer"]]
T = TypeVar("T")


class Pending:
    """The checksum failures of some payloads, once the helper threads are done."""

    def __init__(self, futures: list[Future[list[int]]]) -> None:
        self._futures = futures

    def result(self) -> list[int]:
        return [i for f in self._futures for i in f.result()]


class Checker:
    """Checks loaded payloads in place; checksums run on helper threads (xxh3
    releases the GIL, so they overlap the copies of the calling thread)."""

    def __init__(self, digest: int, body_size: int, threads: int = 1) -> None:
        self.digest = digest
        self.body_size = body_size
        self.threads = max(1, threads)
        self._pool = conn_threads.pool(self.threads, "kvstore-checksum")

    def headers(
        self, batch: Batch, hashes: Sequence[bytes]
    ) -> tuple[list[tuple[int, SlotBuffer]], list[int]]:
        """``(index, slot)`` of payloads whose header fits, and the rest."""
        good: list[tuple[int, SlotBuffer]] = []
        bad: list[int] = []
        for i, slot in batch:
            try:
                check_header(
                    slot.buffer, slot.offset, slot.length, self.digest, hashes[i], self.body_size
                )
            except PayloadError as exc:
                logger.warning("kvstore: not loading block %s: %s", hashes[i].hex()[:16], exc)
                bad.append(i)
                continue
            good.append((i, slot))
        return good, bad

    def bodies(self, good: Sequence[tuple[int, SlotBuffer]]) -> Pending:
        """Indices whose slot (header and body) does not match the checksum the
        sidecar recorded for it (hashed on the helpers; a slot without one came over
        gRPC, checked by the sidecar before it sent it)."""

        def run(part: Sequence[tuple[int, SlotBuffer]]) -> list[int]:
            return [
                i
                for i, s in part
                if s.checksum is not None
                and not slot_matches(s.buffer, s.offset, s.length, s.checksum)
            ]

        n = len(good)
        bounds = [n * k // self.threads for k in range(self.threads + 1)]
        return Pending([
            self._pool.submit(run, good[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)
        ])

    def split(self, items: Sequence[T], fn: Callable[[Sequence[T]], list[int]]) -> list[int]:
        """``fn`` over ``items`` cut in ``threads + 1`` contiguous parts: the helpers
        run the later ones while this thread runs the first; the lists they return,
        joined in order (the helpers' are waited for even when this thread's fails)."""
        parts = self.threads + 1
        n = len(items)
        bounds = [n * k // parts for k in range(parts + 1)]
        cuts = [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
        if not cuts:
            return []
        futures = [self._pool.submit(fn, part) for part in cuts[1:]]
        try:
            first = fn(cuts[0])
        finally:
            rest = [f.result() for f in futures]
        return [i for part in (first, *rest) for i in part]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass(eq=False)
class LoadJob:
    """The blocks one step loads, flattened over its requests."""

    namespace: str
    hashes: list[bytes]
    block_ids: list[int]
    ok: list[bool] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0
    lease: LeaseRead | None = None  # leases still being released (direct loads)
    #: Set once the load is given up (late): no copy into the KV cache starts after.
    cancelled: bool = False
    gate: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.ok = [False] * len(self.hashes)

    def cancel(self) -> bool:
        """Give up a late load: True once no copy into its blocks runs or can start
        (the engine may recompute them now); False while a copy runs (ask again)."""
        if not self.gate.acquire(blocking=False):
            return False
        self.cancelled = True
        self.gate.release()
        return True

    def confirm(self) -> list[bool]:
        """The blocks loaded, once the leases they were read under are released (a
        lease that ended first means they may have been overwritten while read)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            try:
                lease.confirm()
            except KVStoreError as exc:
                logger.warning("kvstore: recomputing %d loaded blocks: %s", len(self.ok), exc)
                self.ok = [False] * len(self.ok)
        return self.ok

    def failed_checksums(self, indices: Sequence[int]) -> None:
        for i in indices:
            logger.warning("kvstore: not loading block %s: checksum mismatch (corrupted)",
                           self.hashes[i].hex()[:16])


class DirectLoad:
    """Load into host KV tensors: slot -> KV tensor, one copy, on the calling thread
    (the step's, for a synchronous load; a connector thread's, asynchronously) and,
    where the copy and its check are one pass, the checksum helpers."""

    def __init__(self, kv: HostKV, checker: Checker, link: SidecarLink) -> None:
        self.kv = kv
        self.checker = checker
        self.link = link

    def run(self, job: LoadJob) -> None:
        def read(batch: Batch) -> list[int]:
            good, bad = self.checker.headers(batch, job.hashes)
            if self.kv.direct:
                with job.gate:  # a load given up (late) copies nothing
                    if job.cancelled:
                        return []
                    failed = self.checker.split(good, copy_checked)
                return done(good, bad, failed)
            pending = self.checker.bodies(good)
            try:
                with job.gate:  # a load given up (late) copies nothing
                    if job.cancelled:
                        return []
                    arrays = SlotArrays()
                    bodies = arrays.rows([s for _, s in good], HEADER_SIZE,
                                         self.checker.body_size)
                    self.kv.from_bodies([job.block_ids[i] for i, _ in good], bodies)
                    arrays.clear()
            finally:
                failed = pending.result()
            return done(good, bad, failed)

        def copy_checked(part: Sequence[tuple[int, SlotBuffer]]) -> list[int]:
            # (each slot copied and its copy hashed in one pass: HostKV.from_slots_checked)
            wrong = self.kv.from_slots_checked([job.block_ids[i] for i, _ in part],
                                               [s for _, s in part], HEADER_SIZE)
            return [part[k][0] for k in wrong]

        def done(good: Sequence[tuple[int, SlotBuffer]], bad: list[int],
                 failed: list[int]) -> list[int]:
            job.failed_checksums(failed)
            for i, _ in good:
                job.ok[i] = True
            for i in [*bad, *failed]:
                job.ok[i] = False
            return failed  # reported to the sidecar, which drops those copies

        # The lease is released in the background, under the forward: confirm() says
        # (after it) whether the lease held while the blocks were read.
        lease = self.link.call(
            "get",
            lambda c: c.lease_in_place(
                # read() checks each header, and each slot against its checksum, in place
                job.namespace, job.hashes, read, max_batch=len(job.hashes), verify=False
            ),
            None,
        )
        if lease is None:
            job.ok = [False] * len(job.hashes)
        job.seconds = time.perf_counter() - job.started
        job.lease = lease


class LayerwiseLoad:
    """Asynchronous load into device KV tensors, layer by layer, on its own thread."""

    def __init__(
        self, kv: DeviceKV, checker: Checker, link: SidecarLink, job: LoadJob, timeout_s: float
    ) -> None:
        self.kv = kv
        self.checker = checker
        self.link = link
        self.job = job
        self.staged: StagedLoad = kv.staged_load(job.block_ids)
        self.deadline = time.monotonic() + timeout_s
        self.late = False
        self.done = threading.Event()
        self._reads = 0


    def start(self) -> None:
        conn_threads.start(self._run, "kvstore-load")

    def _run(self) -> None:
        job = self.job
        try:
            done = self.link.call(
                "get",
                lambda c: c.get_in_place(
                    # _read checks each header, and each slot against its checksum, in place
                    job.namespace, job.hashes, self._read, max_batch=len(job.hashes),
                    verify=False,
                ),
                None,
            )
            if done is None or (self._reads > 1):  # failed, or read twice after launching
                job.ok = [False] * len(job.hashes)
        except Exception:  # never leave the forward waiting
            logger.exception("kvstore: layer-wise load failed")
            job.ok = [False] * len(job.hashes)
        finally:
            self.staged.finish()
            job.seconds = time.perf_counter() - job.started
            self.done.set()

    def _read(self, batch: Batch) -> list[int]:
        job = self.job
        self._reads += 1
        good, bad = self.checker.headers(batch, job.hashes)
        positions = [i for i, _ in good]
        pending = self.checker.bodies(good)
        try:
            arrays = SlotArrays()
            bodies = arrays.rows([s for _, s in good], HEADER_SIZE, self.checker.body_size)
            complete = len(good) == len(job.hashes)
            for layer in range(len(self.kv.layout.layers)):
                self.staged.stage(positions, bodies, [layer])
                if complete:  # every block is here: this layer can go at once
                    self.staged.launch(layer, positions)
            arrays.clear()
        finally:
            failed = pending.result()
        job.failed_checksums(failed)
        for i in positions:
            job.ok[i] = True
        for i in [*bad, *failed]:
            job.ok[i] = False
        return failed  # reported to the sidecar, which drops those copies

    def wait_layer(self, index: int) -> None:
        if self.late:
            return
        if not self.staged.wait_layer(index, max(0.0, self.deadline - time.monotonic())):
            self.give_up()

    def finish(self) -> list[bool]:
        """After the forward: which blocks loaded (a late load loaded none)."""
        if not self.done.wait(max(0.0, self.deadline - time.monotonic())):
            self.give_up()
        if self.late:
            return [False] * len(self.job.hashes)
        for i in range(len(self.kv.layout.layers)):
            self.staged.wait_layer(i, 0.0)  # order the compute stream after every copy
        return list(self.job.ok)

    def give_up(self) -> None:
        if not self.late:
            logger.warning(
                "kvstore: load of %d blocks still running at its deadline; recomputing them",
                len(self.job.hashes),
            )
        self.late = True
        self.staged.cancel()
        self.job.ok = [False] * len(self.job.hashes)

    def release(self) -> None:
        """Give the staging buffer back (only once the thread is done)."""
        if self.done.is_set():
            self.staged.release()
