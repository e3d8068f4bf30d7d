"""Scheduler side: which prefix to load, which blocks to save, what to hint.

Runs in vLLM's scheduler process and only handles keys: block hashes (vLLM's
own, from ``request.block_hashes``) and engine block ids. Bytes move on the
workers (:mod:`.worker`). Every sidecar call fails open through
:class:`~.sidecar.SidecarLink`: when the sidecar cannot answer, a request
simply has no external hit and the engine computes its prefix itself.

Loads are asynchronous (``load_async``, the default): ``get_num_new_matched_tokens``
answers ``load_kv_async=True``, vLLM allocates the request's blocks and parks it
in ``WAITING_FOR_REMOTE_KVS``, the workers copy on a connector thread while the
other requests decode, and report the request among ``get_finished``'s receives
once its blocks are in place (failed blocks through
``get_block_ids_with_load_errors``: vLLM recomputes from the first of them). A
request whose load failed is not offered a load again (its retry, after a load
that failed from the first block, recomputes). With ``load_async=False`` vLLM
marks the step ``has_sync_kv_loads`` and calls ``start_load_kv`` *before* the
forward that reads the loaded blocks (``kv_connector_model_runner_mixin``); on a
GPU the workers still copy layer by layer while the forward runs. Disk hits are
promoted to DRAM by the sidecar from the lookup that found them (its prefetch),
ahead of the copy.

A waiting request costs one Lookup, not one per step: vLLM asks
``get_num_new_matched_tokens`` on every step it cannot schedule the request, and
the scheduler side answers from the request's last lookup while it is younger
than ``lookup_max_age_s``; the answer is dropped when the request is scheduled
(allocated), preempted or finished, so a request that waits again asks again.

Saves are asynchronous: a finished request that had blocks to save keeps its
blocks (``request_finished`` returns True) until every worker reports its
saves done through ``get_finished``. The request's id goes to the workers in
the next step's metadata (``holds``, with the hold time of a held tool-call
gap, or 0), next to the requests preempted that step. Its turn-end hint waits
until its saves are reported, so a hint that moves or drops the session's
blocks never races its last saves.

Why past ~400 lines: this is one vLLM interface (the scheduler half of
``KVConnectorBase_V1``), whose hooks share each request's state; what is pure is
already apart (:mod:`.plans`, :mod:`.sessions`, :mod:`.metadata`, :mod:`.rows`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvstore.connectors.vllm import threads
from kvstore.connectors.vllm.config import ConnectorConfig
from kvstore.connectors.vllm.metadata import (
    BlockSave,
    KVStoreConnectorMetadata,
    LoadPlan,
    SavePlan,
    WorkerReport,
)
from kvstore.connectors.vllm.sessions import SessionTracker, TurnInfo, finished_turn
from kvstore.connectors.vllm.sidecar import SidecarLink

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from kvstore.client import LookupResult

__all__ = ["SchedulerSide"]

logger = logging.getLogger("kvstore.connectors.vllm")


@dataclass(slots=True)
class _Tracked:
    """What the scheduler side knows about one live request."""

    request: Request
    turn: TurnInfo
    sidecar_blocks: int = 0  # leading blocks the sidecar is known to hold
    load_start: int = 0  # first block of the planned load (from the lookup)
    load_blocks: int = 0  # blocks the lookup offered to load
    block_ids: list[int] | None = None
    next_save: int = 0  # first block not yet planned for saving
    planned_load_blocks: int = 0
    loading: bool = False  # an asynchronous load in flight (vLLM frees its blocks)
    async_loads: int = 0  # asynchronous loads the workers reported received
    loaded_blocks: int = 0  # confirmed by the workers (may arrive after the finish)
    load_failed_blocks: int = 0
    saved_blocks: int = 0
    save_failed_blocks: int = 0
    load_ms: float = 0.0
    load_bytes: int = 0
    hit_media: tuple[str, ...] = ()  # fastest tier of each sidecar hit block
    saves_planned: int = 0  # blocks handed to the workers to save
    keep_ms: float = 0.0  # HBM keep the sidecar's policy decided at the lookup
    #: The last lookup's answer while the request waits: (monotonic time, hashes
    #: asked, answer; None when the sidecar could not answer).
    answer: tuple[float, int, LookupResult | None] | None = None


@dataclass(slots=True)
class _PendingHint:
    turn: TurnInfo
    left: int  # blocks whose save is not reported yet


@dataclass(slots=True)
class Totals:
    """What the workers reported since the engine started (all requests)."""

    loaded_blocks: int = 0
    load_failed_blocks: int = 0
    saved_blocks: int = 0
    save_failed_blocks: int = 0
    load_ms: float = 0.0
    load_bytes: int = 0
    save_ms: float = 0.0
    save_bytes: int = 0
    preempted_requests: int = 0  # counted by the scheduler side
    lookup_asks: int = 0  # vLLM's asks for waiting requests (get_num_new_matched_tokens)
    lookups_sent: int = 0  # Lookup calls they cost (the rest answered from the last one)
    async_loads: int = 0  # requests reported received by get_finished

    def as_dict(self) -> dict[str, float]:
        return {name: round(getattr(self, name), 3) for name in self.__slots__}


class SchedulerSide:
    def __init__(
        self,
        config: ConnectorConfig,
        link: SidecarLink,
        namespace: str,
        block_size: int,
        cache_blocks: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self._markers = config.tool_call_markers()
        #: Most blocks HBM keeps may hold at once (0 with no budget: no keeps).
        self.hold_budget = config.hold_budget_blocks or cache_blocks // 4
        #: Finished requests held in the engine: req id -> (blocks, monotonic end).
        self._held: dict[str, tuple[int, float]] = {}
        self.held_blocks_max = 0
        self.link = link
        self.namespace = namespace
        self.block_size = block_size
        self.sessions = SessionTracker(config.default_workload)
        self._reqs: dict[str, _Tracked] = {}
        self._loads: list[LoadPlan] = []
        self._holds: dict[str, float] = {}
        #: Finished requests whose hint waits for their saves.
        self._hint_after_saves: dict[str, _PendingHint] = {}
        self.totals = Totals()
        self._hints = threads.pool(1, "kvstore-hints")

    # -- lookup ---------------------------------------------------------------
    def _track(self, request: Request) -> _Tracked:
        tracked = self._reqs.get(request.request_id)
        if tracked is None:
            turn = self.sessions.classify(request.kv_transfer_params, request.block_hashes)
            tracked = _Tracked(request=request, turn=turn)
            self._reqs[request.request_id] = tracked
        return tracked

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        tracked = self._track(request)
        hashes = list(request.block_hashes)
        tracked.load_blocks = 0
        if not hashes:
            return 0, False
        result = self._lookup(tracked, hashes, num_computed_tokens)
        tracked.keep_ms = result.keep_ms if result is not None else 0.0
        num_hit = min(result.num_hit, len(hashes)) if result is not None else 0
        tracked.sidecar_blocks = num_hit
        tracked.hit_media = tuple(str(m) for m in result.media) if result is not None else ()
        # vLLM must compute at least the last prompt token itself.
        max_blocks = min(num_hit, (request.num_tokens - 1) // self.block_size)
        start = num_computed_tokens // self.block_size
        n = max_blocks - start
        if not self.config.load or n < self.config.min_load_blocks:
            return 0, False
        if tracked.load_failed_blocks:  # its load failed: recompute, do not ask again
            return 0, False
        tracked.load_start, tracked.load_blocks = start, n
        logger.debug(
            "kvstore: request %s hits %d blocks in the sidecar, %d computed locally, loads %d",
            request.request_id,
            num_hit,
            start,
            n,
        )
        return n * self.block_size, self.config.load_async

    def _lookup(self, tracked: _Tracked, hashes: list[bytes], num_computed_tokens: int
                ) -> LookupResult | None:
        """The sidecar's answer for a waiting request: asked once, reused while young.

        vLLM asks again on every step it cannot schedule the request; the stored
        prefix rarely changes within a second, the round trip is paid on the
        scheduler's thread every time. A failed call is reused too (the breaker
        answers it at once anyway)."""
        now = self._clock()
        self.totals.lookup_asks += 1
        cached = tracked.answer
        max_age = self.config.lookup_max_age_s
        if cached is not None and cached[1] == len(hashes) and now - cached[0] < max_age:
            return cached[2]
        request, turn = tracked.request, tracked.turn
        self.totals.lookups_sent += 1
        # The request id ties the saves and the hint to this lookup (and makes a
        # repeat after the answer expired one request to the policy).
        result = self.link.call(
            "lookup",
            lambda c: c.lookup(
                self.namespace,
                hashes,
                turn.session_id,
                turn.workload,
                request_id=request.request_id,
                num_tokens=request.num_tokens,
                then=turn.then,
                tool=turn.tool,
                expected_gap_ms=turn.expected_gap_ms,
                # vLLM's own prefix-cache hit: what the engine kept without any hold
                num_computed_tokens=num_computed_tokens,
            ),
            None,
        )
        tracked.answer = (now, len(hashes), result) if max_age > 0 else None
        return result

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        tracked = self._track(request)
        tracked.answer = None  # scheduled: if it waits again (preempted), ask again
        block_ids = list(blocks.get_block_ids()[0])
        tracked.block_ids = block_ids
        if num_external_tokens <= 0:
            return
        n = min(num_external_tokens // self.block_size, tracked.load_blocks)
        start = tracked.load_start
        if n <= 0 or start + n > len(block_ids):
            logger.warning(
                "kvstore: request %s: cannot map a %d-token load onto %d blocks; not loading",
                request.request_id,
                num_external_tokens,
                len(block_ids),
            )
            return
        hashes = tuple(bytes(h) for h in request.block_hashes[start : start + n])
        asynchronous = self.config.load_async
        self._loads.append(
            LoadPlan(request.request_id, hashes, tuple(block_ids[start : start + n]),
                     asynchronous)
        )
        tracked.planned_load_blocks += n
        tracked.loading = asynchronous
        # Loaded blocks are in the sidecar already: never save them back.
        tracked.next_save = max(tracked.next_save, start + n)

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

    def _hint_now(self, req_id: str) -> None:
        pending = self._hint_after_saves.pop(req_id, None)
        if pending is not None:
            self._hints.submit(self._send_hint, pending.turn, req_id)

    # -- end of a turn ------------------------------------------------------------
    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        tracked = self._reqs.pop(request.request_id, None)
        if tracked is None:
            turn = self.sessions.classify(request.kv_transfer_params, request.block_hashes)
            tracked = _Tracked(request=request, turn=turn)
        turn, event_source = self._turn_end(request, tracked.turn)
        self.sessions.turn_finished(turn, request.block_hashes)
        # Finished while its load runs: vLLM keeps its blocks until the workers
        # report it received; a hold of ours too would free them twice.
        hold_ms = 0.0 if tracked.loading else self._hold_ms(
            request.request_id, tracked, len(block_ids))
        # Blocks handed to the workers may still be in their save queues: vLLM must
        # keep them until the workers say the saves are done.
        saving = bool(block_ids) and tracked.saves_planned > 0 and not tracked.loading
        delay = hold_ms > 0 or saving
        if delay:
            self._holds[request.request_id] = hold_ms / 1000.0
        left = tracked.saves_planned - tracked.saved_blocks - tracked.save_failed_blocks
        # A turn nobody described and whose end the engine did not see: no hint (its
        # ``user`` is a default, not information; see TurnInfo.described).
        hint = self.config.hints and (event_source != "default" or turn.described)
        if hint and saving and left > 0:
            # The hint may move or drop the session's blocks: send it once the
            # turn's last blocks are stored (their reports, or the request's
            # transfers reported done), so no save lands after it.
            self._hint_after_saves[request.request_id] = _PendingHint(turn, left)
        elif hint:
            self._hints.submit(self._send_hint, turn, request.request_id)
        if turn.cache_ttl_s and request.block_hashes:
            # Blocks still being saved are protected once they land (the sidecar keeps
            # the ask until then).
            self._hints.submit(self._send_retain, [bytes(h) for h in request.block_hashes],
                               turn.cache_ttl_s)
        bs = self.block_size
        params = {
            "kvstore": {
                "session_id": turn.session_id,
                "session_inferred": turn.inferred,
                "workload": turn.workload,
                "event": turn.event,
                # What decided the event: stop_token / token_sequence (a tool-call
                # marker), stop (stopped without one), params, default.
                "event_source": event_source,
                "event_claimed": tracked.turn.event,
                "sidecar_hit_tokens": tracked.sidecar_blocks * bs,
                "hit_media": {m: tracked.hit_media.count(m) for m in set(tracked.hit_media)},
                # A failed sync load reschedules the request and an asynchronous
                # one reports its failures with its receive, so by its finish every
                # failure is known; confirmations of a sync load's last step are not.
                "loaded_tokens": (tracked.planned_load_blocks - tracked.load_failed_blocks) * bs,
                "load_failed_tokens": tracked.load_failed_blocks * bs,
                "load_ms": round(tracked.load_ms, 3),
                # Loads reported received off the step (get_finished), none if sync.
                "async_loads": tracked.async_loads,
                "load_bytes": tracked.load_bytes,
                "saved_blocks": tracked.saved_blocks,
                "save_failed_blocks": tracked.save_failed_blocks,
                "held_ms": hold_ms,
                "keep_ms": tracked.keep_ms,  # what the policy decided
                "cache_ttl_s": turn.cache_ttl_s,
                "held_blocks": sum(n for n, _ in self._held.values()),
                "held_blocks_max": self.held_blocks_max,
                "hold_budget_blocks": self.hold_budget,
                "sidecar_up": self.link.is_up,
                # Everything the workers reported so far, all requests together
                # (saves finish after their request does: read them here).
                "totals": self.totals.as_dict(),
            }
        }
        return delay, params

    def _turn_end(self, request: Request, claimed: TurnInfo) -> tuple[TurnInfo, str]:
        """The hint's event from what the engine saw (:func:`~.sessions.finished_turn`)."""
        status = getattr(request, "status", None)
        return finished_turn(
            claimed,
            self._markers,
            stopped=getattr(status, "name", "") == "FINISHED_STOPPED",
            stop_reason=getattr(request, "stop_reason", None),
            output_token_ids=getattr(request, "output_token_ids", None) or (),
        )

    def _hold_ms(self, req_id: str, tracked: _Tracked, blocks: int) -> float:
        """HBM keep of a finished request: the policy's decision (``keep_ms``), capped
        by ``hold_max_ms``, made only while the blocks held stay within the budget."""
        keep = min(tracked.keep_ms, self.config.hold_max_ms)
        if keep <= 0 or not blocks:
            return 0.0
        now = time.monotonic()
        self._held = {r: h for r, h in self._held.items() if h[1] > now}
        held = sum(n for n, _ in self._held.values())
        if held + blocks > self.hold_budget:
            logger.debug(
                "kvstore: request %s not kept in HBM: %d + %d blocks > budget %d",
                req_id, held, blocks, self.hold_budget,
            )
            return 0.0
        self._held[req_id] = (blocks, now + keep / 1e3)
        self.held_blocks_max = max(self.held_blocks_max, held + blocks)
        return keep

    def _send_hint(self, turn: TurnInfo, req_id: str) -> None:
        started = time.monotonic()
        moves = self.link.call(
            "hint",
            lambda c: c.hint(
                turn.session_id,
                turn.event,
                workload=turn.workload,
                tool=turn.tool,
                expected_gap_ms=turn.expected_gap_ms,
                namespace=self.namespace,
                request_id=req_id,  # ends the request the lookup opened
            ),
            0,
        )
        logger.debug(
            "kvstore: hint %s %s (%s) -> %d moves in %.1f ms",
            turn.session_id,
            turn.event,
            turn.workload,
            moves,
            (time.monotonic() - started) * 1e3,
        )

    def _send_retain(self, hashes: list[bytes], ttl_s: float) -> None:
        protected = self.link.call("retain", lambda c: c.retain(self.namespace, hashes, ttl_s),
                                   0)
        logger.debug("kvstore: retained %d of %d blocks for %.0f s", protected, len(hashes),
                     ttl_s)

    def shutdown(self) -> None:
        for req_id in list(self._hint_after_saves):
            self._hint_now(req_id)
        self._hints.shutdown(wait=True, cancel_futures=False)
        self.link.close()
