"""What the engine tells an observer of its traffic, and how it hands out read holds.

Both are interfaces the engine owns and something above it implements: the live
workload profile (:class:`kvstore.profile.live.LiveProfile`, attached by the
server) and the shared-memory plane (:class:`kvstore.engine.dataplane.SlotPlane`,
which attaches itself when it is made for an engine). The engine calls them from
its own operations, so every front end (gRPC, the replay) runs the same path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from kvstore.engine.leases import Lease
from kvstore.tiers.base import Slot
from kvstore.types import BlockMeta

__all__ = ["Held", "Holder", "TrafficObserver"]

#: A read hold: the lease, and per hash the slot to read (None: read it over gRPC)
#: with the block's metadata, or None when it is not stored.
Held = tuple[Lease, list[tuple[Slot | None, BlockMeta] | None]]


class TrafficObserver(Protocol):
    """Sees each first lookup of a request, each store and each hint."""

    def on_lookup(self, namespace: str, hashes: Sequence[bytes], session_id: str = "",
                  workload: str = "") -> None: ...

    def on_store(self, blocks: Iterable[tuple[int, int]]) -> None:
        """(payload bytes, tokens) of each block offered."""

    def on_hint(self, session_id: str, event: str, tool: str = "",
                output_tokens: int = 0) -> None: ...


class Holder(Protocol):
    """Pins stored blocks for a co-located reader (the shared-memory plane)."""

    async def acquire(self, namespace: str, hashes: Sequence[bytes], seconds: float = 0.0,
                      owner: str = "") -> Held: ...
