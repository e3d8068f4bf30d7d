"""The scheduler side at the end of a turn: holds, the hint, the retain, the params.

Part of :class:`~.scheduler.SchedulerSide`. ``request_finished`` decides whether vLLM
keeps the request's blocks (an HBM hold, or saves still in the workers' queues), sends
the turn-end hint (at once, or once the request's saves are reported, so a hint that
moves or drops the session's blocks never races its last saves) and the retain of a
``cache_ttl_s``, and returns the request's ``kv_transfer_params``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from kvstore.connectors.vllm.sessions import TurnInfo, finished_turn
from kvstore.connectors.vllm.tracking import _PendingHint, _Tracked

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from kvstore.connectors.vllm.config import ConnectorConfig
    from kvstore.connectors.vllm.sessions import SessionTracker, ToolCallMarkers
    from kvstore.connectors.vllm.sidecar import SidecarLink
    from kvstore.connectors.vllm.tracking import Totals
    from vllm.v1.request import Request

__all__ = ["TurnEnd"]

logger = logging.getLogger("kvstore.connectors.vllm")


class TurnEnd:
    """The end-of-turn half of :class:`~.scheduler.SchedulerSide`."""

    if TYPE_CHECKING:
        # What this part reads of the scheduler side (set in SchedulerSide.__init__).
        config: ConnectorConfig
        link: SidecarLink
        namespace: str
        block_size: int
        sessions: SessionTracker
        totals: Totals
        hold_budget: int
        held_blocks_max: int
        _markers: ToolCallMarkers
        _reqs: dict[str, _Tracked]
        _holds: dict[str, float]
        _held: dict[str, tuple[int, float]]
        _hint_after_saves: dict[str, _PendingHint]
        _hints: ThreadPoolExecutor

        def _hold_ms(self, req_id: str, tracked: _Tracked, blocks: int) -> float: ...

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
