"""What the engine calls on every placement change: the :class:`EventSink` protocol.

Calls are synchronous and must be cheap (the real sink, :class:`~kvstore.events.bus.EventBus`,
only enqueues). ``metas`` of one ``block_stored`` call are in chain order and the
parent of the first one was announced before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["EventSink", "NullSink", "RecordingSink"]


@runtime_checkable
class EventSink(Protocol):
    def block_stored(self, metas: Sequence[BlockMeta], medium: Medium) -> None: ...

    def block_removed(self, keys: Sequence[BlockKey], medium: Medium) -> None: ...

    def all_cleared(self) -> None: ...


class NullSink:
    """Discards every event (the engine's default when events are disabled)."""

    def block_stored(self, metas: Sequence[BlockMeta], medium: Medium) -> None:
        return None

    def block_removed(self, keys: Sequence[BlockKey], medium: Medium) -> None:
        return None

    def all_cleared(self) -> None:
        return None


@dataclass
class RecordingSink:
    """Keeps every call as ``(kind, items, medium)``, for engine tests."""

    calls: list[tuple[str, tuple[BlockMeta | BlockKey, ...], Medium | None]] = field(
        default_factory=list
    )

    def block_stored(self, metas: Sequence[BlockMeta], medium: Medium) -> None:
        self.calls.append(("stored", tuple(metas), medium))

    def block_removed(self, keys: Sequence[BlockKey], medium: Medium) -> None:
        self.calls.append(("removed", tuple(keys), medium))

    def all_cleared(self) -> None:
        self.calls.append(("cleared", (), None))
