"""The tier interface: a tier stores bytes under a :class:`BlockKey`, nothing else.

Pins, leases, placement, events and eviction decisions belong to the engine
(one owner per lifecycle); a tier only answers put / get / contains / delete and
reports capacity exactly, in bytes.

Optional capabilities are separate protocols, not ``support_x()`` flags:

* :class:`SlotTier` - bytes live in shared memory that co-located clients map
  (the DRAM tier): reserve a slot, let the client write it, commit it.
* :class:`PersistentTier` - blocks survive a restart (the disk tier): recover
  the metadata of what is stored.
* :class:`SharedTier` - other hosts write it too (Redis): find blocks this
  process's index has never seen, and take them into its accounting.
* :class:`CountingTier` - outcome counters (misses, failures) for metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["CountingTier", "PersistentTier", "RemoteBlock", "SharedTier", "Slot", "SlotTier",
           "Tier"]


class Tier(ABC):
    """Async byte store with an exact byte capacity."""

    name: str
    medium: Medium

    @property
    @abstractmethod
    def capacity_bytes(self) -> int: ...

    @property
    @abstractmethod
    def used_bytes(self) -> int:
        """Payload bytes stored (what capacity is enforced against)."""

    @abstractmethod
    def can_fit(self, size: int) -> bool:
        """Whether a put of ``size`` bytes would succeed now without evicting."""

    @abstractmethod
    async def put(self, meta: BlockMeta, payload: bytes | memoryview) -> None:
        """Store a block. Raises BlockTooLargeForTier if it can never fit,
        TierFull if it does not fit now, TierUnavailable on I/O failure.
        Storing a key that is present replaces it."""

    @abstractmethod
    async def get(self, key: BlockKey) -> bytes | memoryview:
        """The payload. Raises BlockNotFound, DataCorruption (checksum mismatch)."""

    @abstractmethod
    async def contains(self, key: BlockKey) -> bool: ...

    @abstractmethod
    async def delete(self, key: BlockKey) -> bool:
        """Remove a block; ``False`` if it was not there."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Idempotent."""

    def unwrap(self) -> Tier:
        """The innermost tier under any decorators (for capability checks)."""
        return self

    # Batch forms: a default loop; tiers override where a batch is cheaper.
    async def put_many(self, items: Sequence[tuple[BlockMeta, bytes | memoryview]]) -> None:
        for meta, payload in items:
            await self.put(meta, payload)

    async def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | memoryview]:
        return [await self.get(k) for k in keys]

    async def delete_many(self, keys: Sequence[BlockKey]) -> int:
        return sum([await self.delete(k) for k in keys])


@dataclass(frozen=True, slots=True)
class Slot:
    """A region of a shared-memory segment holding (or reserved for) one block."""

    slot_id: int
    segment: str
    offset: int
    length: int


@runtime_checkable
class SlotTier(Protocol):
    """A tier whose bytes sit in shared memory that clients on this host map."""

    def segments(self) -> list[tuple[str, int]]:
        """(shm name, size) of every segment clients may attach."""
        ...

    def reserve(self, size: int) -> Slot:
        """Allocate a slot of ``size`` bytes for a client to write. Raises
        BlockTooLargeForTier / TierFull like ``put``. Counts in used_bytes."""
        ...

    def reserve_run(self, sizes: Sequence[int]) -> list[Slot] | None:
        """:meth:`reserve` of each of ``sizes`` at once (one allocation for them all);
        ``None``, nothing reserved, when the free room cannot hold them together."""
        ...

    def view(self, slot: Slot) -> memoryview:
        """Writable view of the slot's bytes (the server side of the data plane)."""
        ...

    def commit(self, slot: Slot, meta: BlockMeta) -> None:
        """The reserved slot becomes the storage of ``meta.key``."""
        ...

    def abort(self, slot: Slot) -> None:
        """Free a reserved, never committed slot."""
        ...

    def locate(self, key: BlockKey) -> Slot:
        """Where a stored block's bytes are. Raises BlockNotFound."""
        ...

    def check_descriptor(self, segment: str, offset: int, length: int) -> None:
        """Raise BadDescriptor unless the range lies inside one of our segments."""
        ...


@runtime_checkable
class PersistentTier(Protocol):
    """A tier whose blocks survive a restart."""

    async def recover(self) -> list[BlockMeta]:
        """Metadata of every intact stored block; half-written leftovers are removed."""
        ...


@dataclass(frozen=True, slots=True)
class RemoteBlock:
    """A block found in a shared tier: its metadata (from the stored header) and the
    seconds it has left there (``None``: no expiry)."""

    meta: BlockMeta
    ttl_s: float | None


@runtime_checkable
class SharedTier(Protocol):
    """A tier that other hosts write too: it may hold blocks this index never saw."""

    async def probe(self, namespace: str, hashes: Sequence[bytes]) -> list[RemoteBlock]:
        """The leading run of ``hashes`` stored in the tier, with their metadata, in
        one round trip. Never raises for an outage: an unreachable store holds nothing."""
        ...

    def adopt(self, block: RemoteBlock) -> None:
        """Count a probed block as held by this process (in ``used_bytes``) until it is
        deleted, found missing, or its TTL passes."""
        ...

    def expired(self) -> list[BlockKey]:
        """Blocks whose TTL has passed since the last call (forgotten by the tier)."""
        ...


@runtime_checkable
class CountingTier(Protocol):
    """A tier that counts outcomes the engine does not see (failures it absorbed)."""

    def counters(self) -> Mapping[str, int]: ...
