"""Saves off the step: a queue that writes each block once, into its own slot.

``wait_for_save`` hands a step's blocks to :meth:`SaveQueue.submit` and
returns; the forward never waits for the sidecar. A device backend first
starts copying the blocks to pinned host memory on its own stream
(:meth:`~.devicekv.DeviceKV.snapshot`); a host backend needs no snapshot,
since vLLM keeps the blocks (see below).

The queue's thread writes each job with ``put_in_place``: it reserves slots
in the sidecar's shared memory, copies every layer's part of each block
straight into its slot, writes the header in front of it, and commits. One
copy per block, no intermediate buffer, and one hash pass: the client takes
each slot's xxh3-64 (header and body) on its call threads while the next
chunk is copied, and that checksum travels with the commit; the sidecar
records it as the block's, and the load checks the slot against it.

vLLM frees a finished request's blocks only when the worker says its
transfers are done (``request_finished`` returned True, ``get_finished``
reports it): :meth:`SaveQueue.busy` says whether a request still has blocks
in the queue. A request preempted while its blocks wait here loses those
saves (:meth:`SaveQueue.preempted`; a dropped save is a future miss), and a
job already reading them is waited for, since the engine reuses the blocks
in the next forward.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvstore.connectors.vllm import threads
from kvstore.connectors.vllm.devicekv import DeviceKV, Snapshot
from kvstore.connectors.vllm.hostkv import HostKV
from kvstore.connectors.vllm.payload import HEADER_SIZE, seal
from kvstore.connectors.vllm.plans import BlockSave, SavePlan
from kvstore.connectors.vllm.rows import SlotArrays

from kvstore.client import BlockSpec, SlotBuffer

if TYPE_CHECKING:
    from kvstore.connectors.vllm.sidecar import SidecarLink

__all__ = ["SaveJob", "SaveQueue", "SaveResult"]

logger = logging.getLogger("kvstore.connectors.vllm")

@dataclass(eq=False)
class SaveJob:
    """One step's blocks to save."""

    plans: list[SavePlan]
    blocks: list[tuple[SavePlan, BlockSave]]
    snapshot: Snapshot | None = None
    dropped: set[str] = field(default_factory=set)  # preempted before the job ran
    copied: threading.Event = field(default_factory=threading.Event)

    @property
    def req_ids(self) -> set[str]:
        return {plan.req_id for plan in self.plans}


@dataclass
class SaveResult:
    """What one job did, per request."""

    saved: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    nbytes: int = 0
    fill_seconds: float = 0.0  # of which copying and sealing (the rest: the sidecar's calls)


class SaveQueue:
    """Saves jobs in order on one thread; thread-safe."""

    def __init__(
        self,
        kv: HostKV | DeviceKV,
        link: SidecarLink,
        namespace: str,
        digest: int,
        on_done: Callable[[SaveJob, SaveResult], None],
    ) -> None:
        self.kv = kv
        self.link = link
        self.namespace = namespace
        self.digest = digest
        self.body_size = kv.layout.block_bytes
        self._on_done = on_done
        self._jobs: deque[SaveJob] = deque()
        self._running: SaveJob | None = None
        self._pending: Counter[str] = Counter()  # req id -> jobs not done
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threads.start(self._loop, "kvstore-save")

    # -- step thread ------------------------------------------------------------------
    def submit(self, plans: Sequence[SavePlan]) -> None:
        blocks = [(plan, b) for plan in plans for b in plan.blocks]
        if not blocks:
            return
        job = SaveJob(list(plans), blocks)
        if isinstance(self.kv, DeviceKV):
            job.snapshot = self.kv.snapshot([b.block_id for _, b in blocks])
        with self._cond:
            self._jobs.append(job)
            self._pending.update(job.req_ids)
            self._cond.notify_all()

    def busy(self, req_id: str) -> bool:
        with self._cond:
            return self._pending[req_id] > 0

    def preempted(self, req_ids: Collection[str]) -> None:
        """Blocks of these requests are about to be reused: drop their queued saves and
        wait until no job reads them any more."""
        req_ids = set(req_ids)
        if not req_ids:
            return
        with self._cond:
            for job in self._jobs:
                job.dropped |= job.req_ids & req_ids
            running = self._running if self._running and self._running.req_ids & req_ids else None
            snapshots = [
                j.snapshot for j in (*self._jobs, running) if j is not None and j.snapshot
            ]
        if running is not None:
            running.copied.wait()
        if isinstance(self.kv, DeviceKV):
            for snap in snapshots:
                self.kv.wait_snapshot(snap)

    def wait_progress(self, timeout_s: float) -> None:
        """Sleep until a job finishes or ``timeout_s`` passes (idle engine steps)."""
        with self._cond:
            if self._jobs or self._running:
                self._cond.wait(timeout_s)

    def drain(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._jobs or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        self.drain(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    # -- save thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._running = self._jobs.popleft()
            try:
                result = self._save(job)
            except Exception:  # a bug here must not stop later saves or hang frees
                logger.exception("kvstore: save job failed")
                result = SaveResult(failed=Counter(p.req_id for p, _ in job.blocks))
            finally:
                job.copied.set()
                if isinstance(self.kv, DeviceKV) and job.snapshot is not None:
                    self.kv.release(job.snapshot)
            self._on_done(job, result)
            with self._cond:
                self._running = None
                self._pending.subtract(job.req_ids)
                self._pending += Counter()  # drop zero counts
                self._cond.notify_all()

    def _save(self, job: SaveJob) -> SaveResult:
        started = time.perf_counter()
        result = SaveResult()
        # One put per request: its request id ties the blocks to the plan its lookup
        # made (a put without one would count as a new request of the session).
        groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        for pos, (plan, _) in enumerate(job.blocks):
            if plan.req_id in job.dropped:
                result.failed[plan.req_id] += 1
                continue
            groups[(plan.req_id, plan.session_id, plan.workload)].append(pos)
        size = HEADER_SIZE + self.body_size
        for (req_id, session_id, workload), positions in groups.items():
            specs = [
                BlockSpec(b.block_hash, b.parent_hash, b.token_ids, size)
                for b in (job.blocks[p][1] for p in positions)
            ]

            def fill(batch: Sequence[tuple[int, SlotBuffer]], positions: list[int] = positions,
                     specs: list[BlockSpec] = specs) -> None:
                began = time.perf_counter()
                self._fill(job, [(positions[k], specs[k].block_hash, slot) for k, slot in batch])
                result.fill_seconds += time.perf_counter() - began

            stored = self.link.call(
                "put",
                lambda c, specs=specs, fill=fill, s=session_id, w=workload, r=req_id: (
                    c.put_in_place(self.namespace, specs, fill, session_id=s, workload=w,
                                   request_id=r)
                ),
                None,
            )
            counts = result.saved if stored is not None else result.failed
            for p in positions:
                counts[job.blocks[p][0].req_id] += 1
            if stored is not None:
                result.nbytes += len(positions) * size
        job.copied.set()
        result.seconds = time.perf_counter() - started
        return result

    def _fill(self, job: SaveJob, items: list[tuple[int, bytes, SlotBuffer]]) -> None:
        """Copy blocks (position in the job, hash, slot) into their slots and write
        each one's header (the client hashes the slots afterwards, chunk by chunk,
        while it hands the next chunk here)."""
        arrays = SlotArrays()
        try:
            bodies = arrays.rows([slot for _, _, slot in items], HEADER_SIZE, self.body_size)
            positions = [p for p, _, _ in items]
            if isinstance(self.kv, HostKV):
                self.kv.to_bodies([job.blocks[p][1].block_id for p in positions], bodies)
            elif job.snapshot is not None:
                self.kv.snapshot_to_bodies(job.snapshot, positions, bodies)
            else:
                raise RuntimeError("a device-backend save job without its snapshot")
            for _, block_hash, slot in items:
                seal(slot.buffer, slot.offset, slot.length, self.digest, block_hash)
        finally:
            arrays.clear()
