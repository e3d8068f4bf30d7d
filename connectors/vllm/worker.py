"""Worker side: move block bytes between vLLM's KV tensors and the sidecar.

Each block moves once each way, between the KV tensors and the sidecar's
shared-memory slots, and never on the forward's critical path when it can be
avoided:

* **Saves** (:mod:`.saves`): ``wait_for_save`` hands the blocks the step
  filled to a queue and returns. Its thread writes each block into a slot it
  reserved (every layer's part copied once, checksummed in place, header,
  commit). vLLM keeps a finished request's blocks until ``get_finished``
  reports its saves done (the scheduler side returns True from
  ``request_finished``); ``handle_preemptions`` drops the queued saves of
  preempted requests before their blocks are reused.
* **Loads** (:mod:`.loads`): asynchronous by default (``load_async``,
  :mod:`.inflight`): ``start_load_kv`` hands a step's loads to a connector
  thread and returns; the loading requests wait in vLLM's
  ``WAITING_FOR_REMOTE_KVS`` while the others decode, and ``get_finished``
  reports each request among its receives once its blocks are in place.
  Synchronous loads (``load_async=False``): vLLM flags the step
  (``has_sync_kv_loads``) and calls ``start_load_kv`` before its forward; host KV
  tensors (the CPU backend) are filled from the leased slots right there; device
  KV tensors through a pinned staging buffer, one host-to-device copy per layer
  on a load stream and thread, and each attention layer's ``wait_for_layer_load``
  waits only for its own layer. Either way blocks that fail (missing, foreign,
  corrupt, or later than ``timeout_s``) are reported by
  ``get_block_ids_with_load_errors`` (an asynchronous load's no later than the
  step that reports its request received) and vLLM recomputes from the first of
  them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvstore.connectors.vllm import threads
from kvstore.connectors.vllm.devicekv import DeviceKV
from kvstore.connectors.vllm.hostkv import HostKV
from kvstore.connectors.vllm.inflight import InflightLoads
from kvstore.connectors.vllm.layout import KVLayout, LayoutError
from kvstore.connectors.vllm.loads import Checker, DirectLoad, LayerwiseLoad, LoadJob
from kvstore.connectors.vllm.metadata import KVStoreConnectorMetadata, LoadPlan, WorkerReport
from kvstore.connectors.vllm.payload import HEADER_SIZE, layout_digest
from kvstore.connectors.vllm.saves import SaveJob, SaveQueue, SaveResult
from kvstore.connectors.vllm.sidecar import SidecarLink

if TYPE_CHECKING:
    import torch

__all__ = ["WorkerSide", "prefault_in_background"]

logger = logging.getLogger("kvstore.connectors.vllm")

#: How long an idle engine step waits for a pending save before polling again.
_IDLE_WAIT_S = 0.005
_SAVE_LOG_LEVEL = logging.DEBUG
_FINISHED_MEMORY = 65536


def prefault_in_background(client: Any) -> None:
    """Map the sidecar's shared memory into this process on a background thread, so
    saves and loads do not pay a page fault per 4 KiB on first touch (a link's
    ``on_connect`` hook: runs again for the new client after a reconnect). The
    thread is one of the connector's own (free of the worker's CPU pinning)."""
    client.prefault_in_background(lambda run: threads.start(run, "kvstore-prefault"))


class WorkerSide:
    def __init__(
        self,
        link: SidecarLink,
        namespace: str,
        num_blocks: int,
        block_size: int,
        timeout_s: float,
        host_threads: int = 4,
        staged: bool | None = None,
    ) -> None:
        # Loads (step thread) and saves (save thread) share the link: calls run
        # concurrently, one breaker, one mapping of the sidecar's shared memory.
        self.link = link
        self.namespace = namespace
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.timeout_s = timeout_s
        self.host_threads = host_threads
        #: Use the staged, layer-wise path (None: when the KV cache is not in host
        #: memory; tests force it on host tensors).
        self.staged = staged
        self.layout: KVLayout | None = None
        self.kv: HostKV | DeviceKV | None = None
        self._digest = 0
        self._checker: Checker | None = None
        self._saves: SaveQueue | None = None
        self._load: LayerwiseLoad | None = None  # this step's layer-wise load
        self._direct: LoadJob | None = None  # this step's direct load
        self._load_plans: list[LoadPlan] = []
        self._inflight = InflightLoads(timeout_s)
        self._last_load: LayerwiseLoad | None = None
        self._invalid: set[int] = set()
        self._report = WorkerReport()
        self._report_lock = threading.Lock()
        self._holds: dict[str, float] = {}  # req id -> monotonic time its hold ends
        # Finished requests vLLM told us about (get_finished may only report those),
        # kept a while in case their hold arrives in a later step.
        self._finished: OrderedDict[str, None] = OrderedDict()
        #: Asynchronous loads settled, not reported yet (get_finished's receives).
        self._received: set[str] = set()

    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        try:
            layout = KVLayout(kv_caches, self.num_blocks)
        except LayoutError as exc:
            logger.error("kvstore: unsupported KV cache layout, connector disabled: %s", exc)
            return
        self.layout = layout
        staged = self.staged if self.staged is not None else layout.device.type != "cpu"
        if not staged:  # the CPU backend: its cores run the model
            self.kv = HostKV(layout)
            self._checker = Checker(layout_digest(self.namespace, layout.signature),
                                    layout.block_bytes)
        else:
            self.kv = DeviceKV(layout, self.host_threads)
            self._checker = Checker(layout_digest(self.namespace, layout.signature),
                                    layout.block_bytes, self.host_threads)
        self._digest = self._checker.digest
        self._saves = SaveQueue(self.kv, self.link, self.namespace, self._digest, self._saved)
        logger.info(
            "kvstore: namespace %s, %d KV tensors, %d bytes per block, %s path (%s)",
            self.namespace,
            len(layout.layers),
            layout.block_bytes,
            "direct host" if isinstance(self.kv, HostKV) else "staged layer-wise",
            layout.signature[:200],
        )

    # -- loads ------------------------------------------------------------------------
    def start_load_kv(self, meta: KVStoreConnectorMetadata) -> None:
        now = time.monotonic()
        self._holds.update((r, now + s) for r, s in meta.holds.items())
        later = [plan for plan in meta.loads if plan.asynchronous]
        if later:
            self._start_async(later)
        plans = [plan for plan in meta.loads if not plan.asynchronous]
        if not plans:
            return
        job = self._job(plans)
        if self.kv is None or self._checker is None:
            self._settle(plans, job, [False] * len(job.hashes))
        elif isinstance(self.kv, HostKV):
            DirectLoad(self.kv, self._checker, self.link).run(job)
            self._direct, self._load_plans = job, plans  # settled after the forward
        else:
            load = LayerwiseLoad(self.kv, self._checker, self.link, job, self.timeout_s)
            previous, self._last_load = self._last_load, load
            load.start()  # its own staging buffer: the previous load may still be running
            if previous is not None:
                previous.release()  # its buffer back to the pool, once its copies are done
            self._load = load
            self._load_plans = plans

    def _job(self, plans: list[LoadPlan]) -> LoadJob:
        hashes = [h for plan in plans for h in plan.hashes]
        ids = [b for plan in plans for b in plan.block_ids]
        return LoadJob(self.namespace, hashes, ids)

    def _start_async(self, plans: list[LoadPlan]) -> None:
        """Off the step: reported by ``get_finished`` once done (or given up)."""
        job = self._job(plans)
        if self.kv is None or self._checker is None:
            self._settle(plans, job, [False] * len(job.hashes))
            self._received.update(plan.req_id for plan in plans)
        elif isinstance(self.kv, HostKV):
            self._inflight.start_direct(plans, job, DirectLoad(self.kv, self._checker, self.link))
        else:
            self._inflight.start_layerwise(
                plans, LayerwiseLoad(self.kv, self._checker, self.link, job, self.timeout_s))

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._load is not None and self.layout is not None:
            index = self.layout.index.get(layer_name)
            if index is not None:
                self._load.wait_layer(index)

    def _finish_load(self) -> None:
        load, self._load = self._load, None
        if load is not None:
            self._settle(self._load_plans, load.job, load.finish())
        direct, self._direct = self._direct, None
        if direct is not None:
            self._settle(self._load_plans, direct, direct.confirm())

    def _settle(self, plans: list[LoadPlan], job: LoadJob, ok: list[bool]) -> None:
        """Report the good prefix of each request; the rest is recomputed."""
        cursor = loaded = 0
        with self._report_lock:
            for plan in plans:
                verdicts = ok[cursor : cursor + len(plan.hashes)]
                cursor += len(plan.hashes)
                good = verdicts.index(False) if False in verdicts else len(verdicts)
                loaded += good
                if good:
                    self._count(self._report.loaded, plan.req_id, good)
                if good < len(plan.block_ids):
                    self._invalid.update(plan.block_ids[good:])
                    self._count(self._report.load_failed, plan.req_id, len(plan.block_ids) - good)
                self._report.load_ms[plan.req_id] = job.seconds * 1e3
                self._report.load_bytes[plan.req_id] = len(plan.hashes) * (
                    (self.layout.block_bytes if self.layout else 0) + HEADER_SIZE
                )
        nbytes = loaded * ((self.layout.block_bytes if self.layout else 0) + HEADER_SIZE)
        logger.info(
            "kvstore: loaded %d/%d blocks (%d tokens, %.1f MiB) in %.1f ms (%.2f GB/s)%s",
            loaded,
            len(job.hashes),
            loaded * self.block_size,
            nbytes / 2**20,
            job.seconds * 1e3,
            nbytes / job.seconds / 1e9 if job.seconds > 0 else 0.0,
            " off the step" if plans and plans[0].asynchronous else "",
        )

    # -- saves ------------------------------------------------------------------------
    def handle_preemptions(self, meta: KVStoreConnectorMetadata) -> None:
        if meta.preempted and self._saves is not None:
            self._saves.preempted(meta.preempted)

    def wait_for_save(self, meta: KVStoreConnectorMetadata) -> None:
        self._finish_load()  # a load's outcome must be known before the step reports
        if meta.saves and self._saves is not None:
            self._saves.submit(meta.saves)

    def _saved(self, job: SaveJob, result: SaveResult) -> None:
        with self._report_lock:
            for req_id, n in result.saved.items():
                self._count(self._report.saved, req_id, n)
            for req_id, n in result.failed.items():
                self._count(self._report.save_failed, req_id, n)
            self._report.save_ms += result.seconds * 1e3
            self._report.save_bytes += result.nbytes
        logger.log(
            _SAVE_LOG_LEVEL,
            "kvstore: saved %d blocks (%.1f MiB) in %.1f ms (%.2f GB/s; copies %.1f ms), %d failed",
            sum(result.saved.values()),
            result.nbytes / 2**20,
            result.seconds * 1e3,
            result.nbytes / result.seconds / 1e9 if result.seconds > 0 else 0.0,
            result.fill_seconds * 1e3,
            sum(result.failed.values()),
        )

    # -- reporting ----------------------------------------------------------------------
    @staticmethod
    def _count(counts: dict[str, int], req_id: str, n: int) -> None:
        counts[req_id] = counts.get(req_id, 0) + n

    def get_finished(
        self, finished_req_ids: set[str], idle: bool = False
    ) -> tuple[set[str] | None, set[str] | None]:
        """``(sending, receiving)``: finished requests vLLM may free now (hold over,
        no save pending), and requests whose asynchronous load is settled (their
        failed blocks go to ``get_block_ids_with_load_errors`` first)."""
        for req_id in finished_req_ids:
            self._finished[req_id] = None
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)
        received = self._poll_loads()
        if not self._holds:
            if not received and idle and len(self._inflight):
                self._inflight.wait(_IDLE_WAIT_S)  # only loads are pending: do not spin
                received = self._poll_loads()
            return None, received or None
        done = self._ready()
        if not done and not received and idle and self._saves is not None:
            # Only transfers are pending: wait a little for one rather than spin.
            if len(self._inflight):
                self._inflight.wait(_IDLE_WAIT_S)
                received = self._poll_loads()
            else:
                self._saves.wait_progress(_IDLE_WAIT_S)
            done = self._ready()
        for req_id in done:
            del self._holds[req_id]
            del self._finished[req_id]
        return done or None, received or None

    def _poll_loads(self) -> set[str]:
        for plans, job, ok in self._inflight.poll():
            self._settle(plans, job, ok)
            self._received.update(plan.req_id for plan in plans)
        received, self._received = self._received, set()
        return received

    def _ready(self) -> set[str]:
        now = time.monotonic()
        saves = self._saves
        return {
            r
            for r, until in self._holds.items()
            if until <= now and r in self._finished and (saves is None or not saves.busy(r))
        }

    def take_load_errors(self) -> set[int]:
        errors, self._invalid = self._invalid, set()
        return errors

    def take_report(self) -> WorkerReport | None:
        with self._report_lock:
            if self._report.is_empty():
                return None
            report, self._report = self._report, WorkerReport()
        return report

    def shutdown(self) -> None:
        self._inflight.close()
        if self._saves is not None:
            self._saves.close(self.timeout_s)
        if self._checker is not None:
            self._checker.close()
        if isinstance(self.kv, DeviceKV):
            self.kv.close()
        self.link.close()
