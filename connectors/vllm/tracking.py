"""What the scheduler side keeps per request, per pending hint, and in total.

The records :class:`~.scheduler.SchedulerSide` and its parts (:mod:`.steps`,
:mod:`.turnend`) share: plain slotted dataclasses, no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstore.connectors.vllm.sessions import TurnInfo

if TYPE_CHECKING:
    from vllm.v1.request import Request

    from kvstore.client import LookupResult

__all__ = ["Totals"]


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
