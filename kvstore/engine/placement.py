"""The engine's placement primitives: room, eviction, copies, drops, transfers.

Every byte a tier holds is placed or freed here, so the rules live once:
capacity is made by asking the policy for victims (demoting them where it
says), and a tenant's quota by asking it for that tenant's victims only; a
copy between tiers checks the source bytes against their checksum; a
dropped copy's bytes are freed only once no reader, copy or request still holds
them (a slot is never reused under a lease); every change tells the policy and
the event stream. A persistent tier takes a block only once it holds the block's
whole prefix, so what it reports stored is reachable after a restart. Retention
(:mod:`kvstore.engine.retention`) is applied here too, once for every policy:
retained blocks are shielded from the policy's victims, go last (demoted, oldest
deadline first), and the policy's own drops skip them.

The primitives are split by part, one class each, that :class:`Placement` puts
together over its one bookkeeping of copies in flight and deferred frees: room and
eviction (:mod:`kvstore.engine.room`), background transfers
(:mod:`kvstore.engine.transfers`), and here the state, the copies, drops and reads they
call (a demotion is a copy that makes room below; a copy into a persistent tier first
copies the block's prefix; a drop waits for the copies and readers that hold the bytes).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Container, Hashable, Sequence

import xxhash

from kvstore.engine.blocks import block_info
from kvstore.engine.durability import RecoveryPoint, WriteHealth
from kvstore.engine.eviction import EvictionManager
from kvstore.engine.index import Entry, Index
from kvstore.engine.leases import Leases
from kvstore.engine.mover import Mover
from kvstore.engine.observe import SharedHooks
from kvstore.engine.quotas import Quota, Quotas
from kvstore.engine.retention import Retention, RetentionLimits
from kvstore.engine.room import Protected, Room
from kvstore.engine.stats import EngineStats
from kvstore.engine.transfers import Transfers
from kvstore.errors import (
    BlockNotFound,
    DataCorruption,
    KVStoreError,
    Unavailable,
)
from kvstore.events import EventSink
from kvstore.policies import BlockInfo, Policy
from kvstore.tiers.base import PersistentTier, SlotTier, Tier
from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["Placement", "Protected"]

log = logging.getLogger("kvstore.engine")


class Placement(Room, Transfers):
    """Tiers, index, policy and the primitives that move bytes between them."""

    def __init__(self, tiers: Sequence[Tier], policy: Policy | EvictionManager,
                 events: EventSink, clock: Callable[[], float], write_back: bool,
                 quotas: Sequence[Quota] = (),
                 retention: RetentionLimits | None = None) -> None:
        if not tiers:
            raise ValueError("the engine needs at least one tier")
        self.tiers: dict[str, Tier] = {t.name: t for t in tiers}
        self.order = [t.name for t in tiers]
        self._rank = {name: i for i, name in enumerate(self.order)}
        #: The policy behind the eviction manager that enforces its victims' rules.
        self.policy = EvictionManager.of(policy)
        self.events = events
        self.clock = clock
        self.write_back = write_back
        self.index = Index(self.order)
        unknown = {t for q in quotas for t in q.limits} - set(self.order)
        if unknown:
            raise ValueError(f"quota for unknown tiers {sorted(unknown)}; tiers: {self.order}")
        self.quotas = Quotas(quotas)
        if self.quotas:
            self.index.on_bytes = self.quotas.charge
        self.retention = Retention(
            retention or RetentionLimits(), {n: t.capacity_bytes for n, t in self.tiers.items()},
            self._tenant)
        self.leases = Leases()
        self.stats = EngineStats()
        self.mover = Mover(self.run_transfer)
        #: Keys being copied between tiers (a count: several copies may overlap).
        self._in_flight: Counter[BlockKey] = Counter()
        #: Dropped copies still held by a reader or a copy: key -> tiers to free later.
        self._deferred_free: dict[BlockKey, set[str]] = {}
        #: (key, dst tier) -> completion of the copy running now
        self._copies: dict[tuple[BlockKey, str], asyncio.Future[None]] = {}
        self._medium: dict[str, Medium] = {name: t.medium for name, t in self.tiers.items()}
        #: Tiers whose bytes co-located clients map (and so could overwrite): every
        #: read from them is checked against the block's checksum.
        self._mapped = {name for name, t in self.tiers.items()
                        if isinstance(t.unwrap(), SlotTier)}
        #: Tiers that survive a restart: a block is copied there only after its prefix,
        #: so what a restart finds is reachable (no chain with a hole above it).
        self._persistent = {name for name, t in self.tiers.items()
                            if isinstance(t.unwrap(), PersistentTier)}
        #: Hooks for a tier other hosts share (kvstore.engine.shared), set by the server.
        self.shared: SharedHooks | None = None
        #: Failed copies into each tier, and which tiers are degraded.
        self.health = WriteHealth()
        #: The write-back deadline of every new block (None: no recovery point).
        self.recovery: RecoveryPoint | None = None

    # -- protection -----------------------------------------------------------------
    def _tenant(self, namespace: str) -> str:
        """The tenant a namespace belongs to: its quota's prefix, or itself."""
        q = self.quotas.quota_of(namespace) if self.quotas else None
        return q.prefix if q is not None else namespace

    def free_pending(self, key: BlockKey) -> bool:
        """True while a dropped copy of ``key`` is still held: storing it again now
        would race the deferred free, so writers skip it this time."""
        return key in self._deferred_free

    def is_protected(self, key: BlockKey) -> bool:
        return key in self.leases.pins or key in self._in_flight

    async def free_deferred(self) -> None:
        """Free dropped copies nobody holds any more (the sweeper calls this)."""
        for key, tier_names in list(self._deferred_free.items()):
            if self.is_protected(key):
                continue
            del self._deferred_free[key]
            entry = self.index.get(key)
            for tier_name in tier_names:
                if entry is None or tier_name not in entry.tiers:
                    await self.tiers[tier_name].delete(key)

    @property
    def persistent(self) -> set[str]:
        """Tiers that survive a restart."""
        return self._persistent

    def rank(self, tier_name: str) -> int:
        """Position of a tier in the order, fastest first."""
        return self._rank[tier_name]

    def _next_tier(self, tier_name: str) -> str | None:
        i = self._rank[tier_name] + 1
        return self.order[i] if i < len(self.order) else None

    # -- placement --------------------------------------------------------------------
    async def put_into(self, tier_name: str, meta: BlockMeta, payload: bytes | memoryview
                       ) -> None:
        """A tier's put, its outcome counted for the tier's health."""
        try:
            await self.tiers[tier_name].put(meta, payload)
        except Unavailable:
            self.health.write_failed(tier_name)
            raise
        self.health.ok(tier_name)

    async def prefix_held(self, meta: BlockMeta, tier_name: str,
                          extra: Container[Hashable] = ()) -> bool:
        """Whether ``tier_name`` may take ``meta``: always, unless it is persistent; then
        only once it holds the block's parent (copied there first, with its own prefix,
        from a faster tier that holds it). A block whose prefix is stored nowhere is
        not stored on a persistent tier: it would be reported durable, and dropped at
        the next start as unreachable."""
        if tier_name not in self._persistent or meta.parent_hash is None:
            return True
        above = self.index.get_hash(meta.key.namespace, meta.parent_hash)
        if above is None:
            return False
        if tier_name not in above.tiers:
            try:
                await self._copy_prefix(above, tier_name, extra)
            except KVStoreError as exc:
                log.debug("prefix of %s not copied to %s: %s", meta.key, tier_name, exc)
        return tier_name in above.tiers

    def stored(self, meta: BlockMeta, tier_name: str) -> Entry:
        return self.stored_many((meta,), tier_name)[0]

    def stored_many(self, metas: Sequence[BlockMeta], tier_name: str) -> list[Entry]:
        """Index blocks whose bytes are in ``tier_name`` now, in order, and tell the
        policy (one call) and the event stream (one event per chain run)."""
        add, index = self.index.add_location, self.index
        entries: list[Entry] = []
        infos: list[BlockInfo] = []
        prev: BlockInfo | None = None
        for meta in metas:
            entry = add(meta, tier_name)
            info = entry.info
            if info is None:
                info = entry.info = block_info(meta, prev)
            prev = info
            entries.append(entry)
            infos.append(info)
        now = self.clock()
        self.policy.on_insert_many(infos, tier_name, now)
        self.events.block_stored(metas, self._medium[tier_name])
        retention = self.retention
        for entry in entries:
            retention.on_stored(entry, index, now)
        return entries

    async def copy(self, entry: Entry, src: str, dst: str,
                   extra: Container[Hashable] = ()) -> None:
        """Copy a block into ``dst`` (no-op if it is there); concurrent copies of one
        block to one tier share a single transfer."""
        key = entry.key
        if dst in entry.tiers:
            return
        running = self._copies.get((key, dst))
        if running is not None:
            await asyncio.shield(running)
            return
        done = asyncio.get_running_loop().create_future()
        self._copies[(key, dst)] = done
        try:
            await self._copy_once(entry, src, dst, extra)
        finally:
            del self._copies[(key, dst)]
            done.set_result(None)

    async def _copy_once(self, entry: Entry, src: str, dst: str,
                         extra: Container[Hashable]) -> None:
        key = entry.key
        parent = entry.meta.parent_hash
        if parent is not None:
            above = self.index.get_hash(key.namespace, parent)
            if above is None:
                return  # its prefix is gone from every tier: no lookup can reach it there
            if dst in self._persistent and dst not in above.tiers:
                await self._copy_prefix(above, dst, extra)
                if dst not in above.tiers:
                    return  # the prefix could not be made durable: neither is this block
        self._in_flight[key] += 1
        try:
            payload = await self.tiers[src].get(key)
            await self.make_room(dst, entry.meta.size, extra, key.namespace)
            await self.put_into(dst, entry.meta, payload)
            # The source bytes must match their checksum (a mapped tier's may have been
            # overwritten by a client, or changed under the copy): a corrupt source is
            # dropped, never copied on or served.
            if xxhash.xxh3_64_intdigest(payload) != entry.meta.checksum:
                await self.tiers[dst].delete(key)
                await self.drop_corrupt(key, src, f"while being copied to {dst!r}")
                raise DataCorruption(f"{key} is corrupt in {src!r}; dropped")
            if self.index.get(key) is not entry:
                await self.tiers[dst].delete(key)  # deleted while we copied: keep it deleted
                return
            self.stored(entry.meta, dst)
            self.stats.moved_bytes[(src, dst)] += entry.meta.size
        finally:
            self._in_flight[key] -= 1
            if self._in_flight[key] <= 0:
                del self._in_flight[key]

    async def _copy_prefix(self, entry: Entry, dst: str, extra: Container[Hashable]) -> None:
        """Copy ``entry`` and its ancestors missing from ``dst`` there, oldest first.
        Nothing is copied where an ancestor is stored nowhere (no lookup reaches the
        chain any more), and the copies stop at the first that did not land: each
        block's copy would otherwise retry its whole prefix again, 2^n calls for a
        chain of n."""
        chain = [entry]
        seen = {id(entry)}
        ns = entry.key.namespace
        while (parent := chain[-1].meta.parent_hash) is not None:
            above = self.index.get_hash(ns, parent)
            if above is None:
                return  # the chain's head is gone: none of it can be made durable
            if dst in above.tiers or id(above) in seen:
                break
            chain.append(above)
            seen.add(id(above))
        for e in reversed(chain):
            if dst not in e.tiers and e.tiers:
                await self.copy(e, e.tiers[0], dst, extra)
            if dst not in e.tiers:
                return  # not copied (its prefix gone meanwhile, or no room): nor its children

    def forget(self, key: BlockKey, tier_name: str) -> None:
        """Forget ``key``'s copy in a tier (index, policy, event stream); its bytes are
        the caller's to free, or to leave (a shared tier's, another host may use)."""
        self.index.remove_location(key, tier_name)
        self.policy.on_remove(key, tier_name)
        self.events.block_removed((key,), self._medium[tier_name])

    def unlink(self, key: BlockKey, tier_name: str) -> bool:
        """Forget ``key``'s copy in a tier; True if its bytes are to be freed now, False
        if a reader or a copy still holds them: then they are freed once let go
        (:meth:`free_deferred`), so a slot is never reused under a lease."""
        self.forget(key, tier_name)
        if self.is_protected(key):
            self._deferred_free.setdefault(key, set()).add(tier_name)
            return False
        return True

    async def _drop(self, key: BlockKey, tier_name: str) -> None:
        """Forget ``key`` in a tier and free its bytes (see :meth:`unlink`)."""
        if self.unlink(key, tier_name):
            await self.tiers[tier_name].delete(key)

    async def drop_corrupt(self, key: BlockKey, tier_name: str, where: str) -> None:
        self.stats.corrupt_reads += 1
        log.error("corrupt copy of %s in %s (%s): dropped", key, tier_name, where)
        entry = self.index.get(key)
        if entry is not None and tier_name in entry.tiers:
            await self._drop(key, tier_name)

    async def read(self, entry: Entry) -> bytes | None:
        """A verified copy of the block's bytes from its fastest intact tier."""
        for tier_name in list(entry.tiers):
            try:
                payload = bytes(await self.tiers[tier_name].get(entry.key))
            except DataCorruption as exc:
                await self.drop_corrupt(entry.key, tier_name, str(exc))
                continue
            except BlockNotFound:
                await self._drop(entry.key, tier_name)
                continue
            if (tier_name in self._mapped
                    and xxhash.xxh3_64_intdigest(payload) != entry.meta.checksum):
                await self.drop_corrupt(entry.key, tier_name, "checksum mismatch on read")
                continue
            return payload
        return None
