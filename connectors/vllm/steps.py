"""The scheduler side per step: the workers' metadata out, their reports in.

Part of :class:`~.scheduler.SchedulerSide`. ``build_connector_meta`` hands the workers
the step's loads (planned at allocation, :mod:`.scheduler`), the saves of the blocks the
step fills, the requests held or preempted; ``update_connector_output`` counts what the
workers reported into each request and the totals, and releases the turn-end hints that
waited for a request's saves (:mod:`.turnend`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvstore.connectors.vllm.metadata import (
    BlockSave,
    KVStoreConnectorMetadata,
    SavePlan,
    WorkerReport,
)

if TYPE_CHECKING:
    from kvstore.connectors.vllm.config import ConnectorConfig
    from kvstore.connectors.vllm.metadata import LoadPlan
    from kvstore.connectors.vllm.tracking import Totals, _PendingHint, _Tracked
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput

__all__ = ["Steps"]


class Steps:
    """The per-step half of :class:`~.scheduler.SchedulerSide`."""

    if TYPE_CHECKING:
        # What this part reads of the scheduler side (set in SchedulerSide.__init__).
        config: ConnectorConfig
        block_size: int
        totals: Totals
        _reqs: dict[str, _Tracked]
        _loads: list[LoadPlan]
        _holds: dict[str, float]
        _hint_after_saves: dict[str, _PendingHint]

        def _hint_now(self, req_id: str) -> None: ...

    # -- per step ---------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVStoreConnectorMetadata:
        meta = KVStoreConnectorMetadata(
            loads=self._loads,
            holds=self._holds,
            preempted=set(getattr(scheduler_output, "preempted_req_ids", None) or ()),
            idle=getattr(scheduler_output, "total_num_scheduled_tokens", 1) == 0,
        )
        self._loads, self._holds = [], {}
        self.totals.preempted_requests += len(meta.preempted)
        for req_id in meta.preempted:
            preempted = self._reqs.get(req_id)
            if preempted is not None:
                preempted.answer = None
        scheduled = scheduler_output.num_scheduled_tokens
        for new_req in scheduler_output.scheduled_new_reqs:
            tracked = self._reqs.get(new_req.req_id)
            if tracked is None:
                continue
            tracked.block_ids = list(new_req.block_ids[0])
            after = new_req.num_computed_tokens + scheduled.get(new_req.req_id, 0)
            self._plan_save(meta, tracked, after)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._reqs.get(req_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_ids[0]) if new_ids is not None else []
            elif new_ids is not None:
                tracked.block_ids = (tracked.block_ids or []) + list(new_ids[0])
            after = cached.num_computed_tokens[i] + scheduled.get(req_id, 0)
            self._plan_save(meta, tracked, after)
        return meta

    def _plan_save(self, meta: KVStoreConnectorMetadata, tracked: _Tracked, after: int) -> None:
        """Save the blocks this step fills (their KV exists once its forward ran)."""
        if not self.config.save or not tracked.block_ids:
            return
        request = tracked.request
        hashes = request.block_hashes
        full = min(after // self.block_size, len(hashes), len(tracked.block_ids))
        start = max(tracked.next_save, tracked.sidecar_blocks)
        if full <= start:
            tracked.next_save = max(tracked.next_save, full)
            return
        bs = self.block_size
        tokens = request.all_token_ids
        blocks = tuple(
            BlockSave(
                block_hash=bytes(hashes[i]),
                parent_hash=bytes(hashes[i - 1]) if i else None,
                token_ids=tuple(tokens[i * bs : (i + 1) * bs]),
                block_id=tracked.block_ids[i],
            )
            for i in range(start, full)
        )
        tracked.next_save = full
        tracked.saves_planned += len(blocks)
        turn = tracked.turn
        meta.saves.append(SavePlan(request.request_id, turn.session_id, turn.workload, blocks))

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        report = getattr(output, "kv_connector_worker_meta", None)
        if isinstance(report, WorkerReport):
            self._take_report(report)
        # A request reported finished has no save left anywhere: send its hint.
        for req_id in getattr(output, "finished_sending", None) or ():
            self._hint_now(req_id)
        for req_id in getattr(output, "finished_recving", None) or ():
            self.totals.async_loads += 1
            tracked = self._reqs.get(req_id)
            if tracked is not None:
                tracked.loading = False
                tracked.async_loads += 1

    def _take_report(self, report: WorkerReport) -> None:
        totals = self.totals
        totals.loaded_blocks += sum(report.loaded.values())
        totals.load_failed_blocks += sum(report.load_failed.values())
        totals.saved_blocks += sum(report.saved.values())
        totals.save_failed_blocks += sum(report.save_failed.values())
        totals.load_ms += sum(report.load_ms.values())
        totals.load_bytes += sum(report.load_bytes.values())
        totals.save_ms += report.save_ms
        totals.save_bytes += report.save_bytes
        for req_id, n in report.loaded.items():
            if req_id in self._reqs:
                self._reqs[req_id].loaded_blocks += n
        for req_id, n in report.load_failed.items():
            if req_id in self._reqs:
                self._reqs[req_id].load_failed_blocks += n
        for req_id, n in report.saved.items():
            if req_id in self._reqs:
                tracked = self._reqs[req_id]
                tracked.saved_blocks += n
        for req_id, ms in report.load_ms.items():
            if req_id in self._reqs:
                self._reqs[req_id].load_ms += ms
                self._reqs[req_id].load_bytes += report.load_bytes.get(req_id, 0)
        for req_id, n in report.save_failed.items():
            if req_id in self._reqs:
                self._reqs[req_id].save_failed_blocks += n
        for counts in (report.saved, report.save_failed):
            for req_id, n in counts.items():
                pending = self._hint_after_saves.get(req_id)
                if pending is not None:
                    pending.left -= n
                    if pending.left <= 0:
                        self._hint_now(req_id)
