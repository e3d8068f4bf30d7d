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

The scheduler half of ``KVConnectorBase_V1`` is one class whose hooks share each
request's state, put together from its parts: the lookup, the load plan at allocation
and the HBM hold budget here, the per-step metadata and reports in :mod:`.steps`, the
end of a turn in :mod:`.turnend`, the records they share in :mod:`.tracking`; what is
pure is in :mod:`.plans`, :mod:`.sessions`, :mod:`.metadata`, :mod:`.rows`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvstore.connectors.vllm import threads
from kvstore.connectors.vllm.config import ConnectorConfig
from kvstore.connectors.vllm.metadata import LoadPlan
from kvstore.connectors.vllm.sessions import SessionTracker
from kvstore.connectors.vllm.sidecar import SidecarLink
from kvstore.connectors.vllm.steps import Steps
from kvstore.connectors.vllm.tracking import Totals, _PendingHint, _Tracked
from kvstore.connectors.vllm.turnend import TurnEnd

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request

    from kvstore.client import LookupResult

__all__ = ["SchedulerSide", "Totals"]

logger = logging.getLogger("kvstore.connectors.vllm")


class SchedulerSide(TurnEnd, Steps):
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

    def shutdown(self) -> None:
        for req_id in list(self._hint_after_saves):
            self._hint_now(req_id)
        self._hints.shutdown(wait=True, cancel_futures=False)
        self.link.close()
