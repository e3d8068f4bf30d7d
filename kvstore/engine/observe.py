"""The interfaces the engine owns for what is attached to it from outside.

Each is implemented by something the engine does not import: the live workload
profile (:class:`kvstore.profile.live.LiveProfile`, attached by the server), the
shared-memory plane (:class:`kvstore.engine.dataplane.SlotPlane`, which attaches
itself when it is made for an engine) and a tier other hosts share
(:class:`kvstore.engine.shared.SharedPrefix`, attached by the server). The engine calls them from
its own operations, so every front end (gRPC, the replay) runs the same path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from kvstore.engine.index import Entry
from kvstore.engine.leases import Lease
from kvstore.tiers.base import Slot
from kvstore.types import BlockMeta, Medium

__all__ = ["Held", "Holder", "SharedHooks", "TrafficObserver"]

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


class SharedHooks(Protocol):
    """What the placement asks of a tier other hosts share (the engine's interface to
    :class:`kvstore.engine.shared.SharedPrefix`)."""

    def after_store(self, entry: Entry) -> None:
        """A block was stored here: queue its copy to the shared tier, if it shares them."""

    def sweep(self) -> int:
        """Forget the shared blocks whose TTL passed; returns how many."""

    async def extend(self, namespace: str, hashes: Sequence[bytes], start: int,
                     count: bool = True) -> list[Medium]:
        """Media of the blocks after ``hashes[:start]`` found in the shared tier (adopted
        into the index); ``count=False``: a repeated lookup, its statistics counted."""
