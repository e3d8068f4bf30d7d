"""The shared-memory data plane's reads: acquire, release, verify.

A co-located reader *acquires* a lease on the slots of stored blocks (promoted from
slower tiers into shared memory first), copies the bytes out, checks each against its
checksum and *releases*, naming the blocks whose bytes did not match; the plane checks
those itself and drops a corrupt copy. A part of :class:`~kvstore.engine.dataplane.SlotPlane`
(its writes are there).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import xxhash

from kvstore.engine.leases import Lease, check_lease_seconds
from kvstore.engine.pace import Pace
from kvstore.errors import BlockNotFound, DataCorruption, TierFull
from kvstore.tiers.base import Slot, SlotTier, Tier
from kvstore.types import BlockKey, BlockMeta

if TYPE_CHECKING:
    from kvstore.engine.core import Engine

__all__ = ["SlotReads"]

log = logging.getLogger(__name__)


class SlotReads:
    """The reads of :class:`~kvstore.engine.dataplane.SlotPlane`."""

    if TYPE_CHECKING:
        # (set in SlotPlane.__init__)
        engine: Engine
        tier: Tier
        slots: SlotTier

    async def acquire(self, namespace: str, hashes: Sequence[bytes], seconds: float = 0.0,
                      owner: str = "") -> tuple[Lease, list[tuple[Slot | None, BlockMeta] | None]]:
        """Pin blocks in shared memory for reading, promoting them from slower tiers.

        Per hash: ``None`` if not stored; ``(None, meta)`` if stored but it could not
        be brought into shared memory now (the tier is full of pinned blocks, or leases
        already pin ``max_pinned_fraction`` of it): read that one through
        ``Engine.get``. The lease belongs to ``owner``."""
        eng = self.engine
        seconds = check_lease_seconds(seconds, eng.lease_seconds, eng.max_lease_seconds)
        hashes = eng.check_hashes(namespace, hashes, unique=True)
        eng.index.require_namespace(namespace)
        now = eng.clock()
        found: list[tuple[Slot | None, BlockMeta] | None] = []
        keys: list[BlockKey] = []
        budget = [int(eng.max_pinned_fraction * self.tier.capacity_bytes)
                  - eng.leases.pinned_bytes]
        pace = Pace()
        try:
            for h in hashes:
                if pace.due():
                    await pace.pause()  # let other calls in (loop lag)
                if not self._acquire_here(namespace, h, found, keys, budget):
                    await self._acquire_one(namespace, h, found, keys, budget)
        finally:
            eng.leases.unpin(tuple(keys))
            # One policy call for every block read (head first, as they were read): the
            # blocks are pinned until here, so no eviction in between could have
            # picked one the policy had not seen read yet.
            eng.policy.on_access_many(keys, [self.tier.name] * len(keys), now)
        nbytes = sum(f[1].size for f in found if f is not None and f[0] is not None)
        lease = eng.leases.acquire(tuple(keys), now, seconds, owner, nbytes)
        eng.stats.gets += 1
        return lease, found

    def _acquire_here(self, namespace: str, h: bytes,
                      found: list[tuple[Slot | None, BlockMeta] | None],
                      keys: list[BlockKey], budget: list[int]) -> bool:
        """:meth:`_acquire_one` for a block in this tier within the pinning budget (most
        reads): no coroutine. False where that one must run (missing, elsewhere, past
        the budget)."""
        eng = self.engine
        entry = eng.index.get_hash(namespace, h)
        if entry is None or self.tier.name not in entry.tiers:
            return False
        pins = eng.leases.pins
        pinned = entry.key in pins
        size = entry.meta.size
        if not pinned:
            if size > budget[0]:
                return False
            budget[0] -= size
        found.append((self.slots.locate(entry.key), entry.meta))
        keys.append(entry.key)
        pins[entry.key] += 1  # protect it from evictions caused by promoting the next ones
        eng.stats.bytes_out += size
        return True

    async def _acquire_one(self, namespace: str, h: bytes,
                           found: list[tuple[Slot | None, BlockMeta] | None],
                           keys: list[BlockKey], budget: list[int]) -> None:
        eng = self.engine
        name = self.tier.name
        entry = eng.index.get_hash(namespace, h)
        # A block another lease pins already costs no more room (a held read renewing
        # its lease takes a new one before it ends the old).
        pinned = entry is not None and entry.key in eng.leases.pins
        if entry is not None and not pinned and entry.meta.size > budget[0]:
            found.append((None, entry.meta))  # past the pinning budget: read over gRPC
            return
        if entry is not None and name not in entry.tiers:
            try:
                await eng.placement.copy(entry, entry.tiers[0], name)  # promote for the read
            except (TierFull, DataCorruption, BlockNotFound) as exc:
                log.info("could not promote %s for a read: %s", entry.key, exc)
            entry = eng.index.get_hash(namespace, h)
        if entry is None:
            found.append(None)
            return
        if name not in entry.tiers:
            found.append((None, entry.meta))
            return
        found.append((self.slots.locate(entry.key), entry.meta))
        keys.append(entry.key)
        if not pinned:
            budget[0] -= entry.meta.size
        # Protect it from evictions caused by promoting the next ones.
        eng.leases.pins[entry.key] += 1
        eng.stats.bytes_out += entry.meta.size

    async def release(self, lease_id: int, owner: str = "",
                      corrupt: Sequence[bytes] = ()) -> int:
        """End a lease. ``corrupt``: hashes of blocks the client read under it whose
        bytes did not match their checksum; each is checked here and a corrupt copy is
        dropped. Returns how many were. Raises LeaseExpired if the lease ran out
        (the client must discard what it read)."""
        eng = self.engine
        lease = eng.leases.get(lease_id, owner)
        dropped = 0
        if lease is not None and corrupt:
            wanted = set(corrupt)
            for key in lease.keys:
                if key.block_hash in wanted:
                    dropped += await self.verify(key)
        eng.leases.release(lease_id, eng.clock(), owner)
        return dropped

    async def verify(self, key: BlockKey) -> int:
        """Check ``key``'s bytes in shared memory; drop them if corrupt (1) or not (0)."""
        eng = self.engine
        entry = eng.index.get(key)
        if entry is None or self.tier.name not in entry.tiers:
            return 0
        view = self.slots.view(self.slots.locate(key))
        if xxhash.xxh3_64_intdigest(view) == entry.meta.checksum:
            return 0
        await eng.placement.drop_corrupt(key, self.tier.name, "reported by a reader")
        return 1
