"""Asynchronous loads: the blocks of waiting requests copied off the forward step.

vLLM puts a request whose load is asynchronous (``load_kv_async``) in
``WAITING_FOR_REMOTE_KVS`` and keeps scheduling the others; the request is
scheduled once its id comes back in ``get_finished``'s receives. A step's
asynchronous loads are one :class:`~.loads.LoadJob` (one ``Acquire`` for all
its blocks) run on a connector thread: :class:`~.loads.DirectLoad` into host
KV tensors, :class:`~.loads.LayerwiseLoad` (its own thread) into device ones.
:meth:`InflightLoads.poll` (each step's ``get_finished``) hands back the jobs
that are done, and the ones past their deadline (``timeout_s`` after they
started) as failed: a late host job is cancelled first (no copy into its
blocks starts after, and one that is running is waited for on a later step,
never in this one), so the engine recomputes blocks nothing writes any more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvstore.connectors.vllm import threads
from kvstore.connectors.vllm.loads import DirectLoad, LayerwiseLoad, LoadJob

if TYPE_CHECKING:
    from kvstore.connectors.vllm.plans import LoadPlan

__all__ = ["Finished", "InflightLoads"]

logger = logging.getLogger("kvstore.connectors.vllm")

#: One finished job: its plans, the job, and each block's verdict.
Finished = tuple[list["LoadPlan"], LoadJob, list[bool]]


@dataclass(eq=False)
class _Inflight:
    plans: list[LoadPlan]
    job: LoadJob
    deadline: float
    done: threading.Event = field(default_factory=threading.Event)
    layerwise: LayerwiseLoad | None = None


class InflightLoads:
    """The asynchronous loads of one worker, started by ``start`` and collected by
    ``poll`` (both on the step's thread)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._running: list[_Inflight] = []
        self._late: list[LayerwiseLoad] = []  # given up, staging buffers not back yet
        # Two: a job given up while its call still waits for the sidecar (until the
        # call's own deadline) does not hold up the next step's.
        self._pool = threads.pool(2, "kvstore-async-load")
        self._any_done = threading.Condition()

    def __len__(self) -> int:
        return len(self._running)

    def start_direct(self, plans: Sequence[LoadPlan], job: LoadJob, load: DirectLoad) -> None:
        item = _Inflight(list(plans), job, self.clock() + self.timeout_s)

        def run() -> None:
            try:
                load.run(job)
                job.confirm()  # the leases held while the blocks were read
            except Exception:  # never leave the request waiting
                logger.exception("kvstore: asynchronous load failed")
                job.ok = [False] * len(job.hashes)
            finally:
                self._signal(item)

        self._running.append(item)
        self._pool.submit(run)

    def start_layerwise(self, plans: Sequence[LoadPlan], load: LayerwiseLoad) -> None:
        item = _Inflight(list(plans), load.job, self.clock() + self.timeout_s, layerwise=load)
        self._running.append(item)
        load.start()

        def watch() -> None:
            load.done.wait()
            self._signal(item)

        threads.start(watch, "kvstore-async-watch")

    def _signal(self, item: _Inflight) -> None:
        with self._any_done:
            item.done.set()
            self._any_done.notify_all()

    def wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a running job to end (an idle step: only
        transfers are pending, so wait a little rather than spin)."""
        with self._any_done:
            if self._running and not any(i.done.is_set() for i in self._running):
                self._any_done.wait(timeout_s)

    def poll(self) -> list[Finished]:
        """The jobs done since the last poll, and the late ones as failed."""
        now = self.clock()
        out: list[Finished] = []
        keep: list[_Inflight] = []
        for item in self._running:
            n = len(item.job.hashes)
            if item.done.is_set():
                if item.layerwise is not None:
                    ok = item.layerwise.finish()  # done: orders the compute after its copies
                    item.layerwise.release()
                else:
                    ok = list(item.job.ok)
                out.append((item.plans, item.job, ok))
            elif now >= item.deadline and self._give_up(item):
                logger.warning(
                    "kvstore: asynchronous load of %d blocks still running after %.1f s; "
                    "recomputing them", n, self.timeout_s)
                item.job.seconds = time.perf_counter() - item.job.started
                out.append((item.plans, item.job, [False] * n))
            else:
                keep.append(item)
        self._running = keep
        self._late = [load for load in self._late if not self._released(load)]
        return out

    def _give_up(self, item: _Inflight) -> bool:
        if item.layerwise is not None:
            item.layerwise.give_up()
            self._late.append(item.layerwise)
            return True
        return item.job.cancel()

    @staticmethod
    def _released(load: LayerwiseLoad) -> bool:
        if not load.done.is_set():
            return False
        load.release()
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
