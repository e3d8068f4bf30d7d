"""Making room in a tier: the policy's victims, demoted where it says, then dropped.

Part of :class:`~kvstore.engine.placement.Placement` (its capacity half): capacity is
made by asking the policy for victims (demoting them where it says), and a tenant's
quota by asking it for that tenant's victims only. Retained blocks
(:mod:`kvstore.engine.retention`) are shielded from the policy's victims and go last
(demoted, oldest deadline first). A demotion is a copy (:meth:`Placement.copy`) and a
drop frees the bytes once nobody holds them (:meth:`Placement.unlink`): both stay in
:mod:`kvstore.engine.placement`, which this module must not import.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Hashable, Sequence
from typing import TYPE_CHECKING

from kvstore.engine.quotas import OtherTenants
from kvstore.engine.retention import Shielded
from kvstore.errors import QuotaExceeded, TierFull
from kvstore.tiers._common import check_size
from kvstore.types import BlockKey

if TYPE_CHECKING:
    from kvstore.engine.durability import WriteHealth
    from kvstore.engine.eviction import EvictionManager
    from kvstore.engine.index import Entry, Index
    from kvstore.engine.leases import Leases
    from kvstore.engine.quotas import Quotas
    from kvstore.engine.retention import Retention
    from kvstore.engine.stats import EngineStats
    from kvstore.tiers.base import Tier

__all__ = ["Protected", "Room"]

_MAX_EVICTION_ROUNDS = 64


class Protected(Container[Hashable]):
    """Keys no eviction may take: pinned by a lease, being copied, reserved, or
    ``extra`` (the blocks of the request being stored). Checked lazily, key by key."""

    __slots__ = ("_extra", "_owner")

    def __init__(self, owner: Room, extra: Container[Hashable] = ()) -> None:
        self._owner = owner
        self._extra = extra

    def __contains__(self, key: object) -> bool:
        o = self._owner
        return (key in self._extra or key in o.leases.pins or key in o._in_flight
                or key in o.leases.reserved)


class Room:
    """The capacity half of :class:`~kvstore.engine.placement.Placement`."""

    if TYPE_CHECKING:
        # What this part reads of the placement (set in Placement.__init__).
        tiers: dict[str, Tier]
        index: Index
        policy: EvictionManager
        clock: Callable[[], float]
        quotas: Quotas
        retention: Retention
        leases: Leases
        stats: EngineStats
        health: WriteHealth
        _in_flight: Counter[BlockKey]

        def is_protected(self, key: BlockKey) -> bool: ...
        def _next_tier(self, tier_name: str) -> str | None: ...
        async def copy(self, entry: Entry, src: str, dst: str,
                       extra: Container[Hashable] = ()) -> None: ...
        async def _drop(self, key: BlockKey, tier_name: str) -> None: ...

    # -- capacity -------------------------------------------------------------------
    def copying(self, tier_name: str) -> bool:
        """Whether blocks of ``tier_name`` are being copied to another tier now (they
        are pinned until the copy ends)."""
        for key in self._in_flight:
            entry = self.index.get(key)
            if entry is not None and tier_name in entry.tiers:
                return True
        return False

    async def make_room(self, tier_name: str, size: int,
                        extra: Container[Hashable] = (), namespace: str = "",
                        quota_pending: int = 0) -> None:
        """Evict (demoting where the policy says) until ``size`` bytes fit in the tier;
        keys in ``extra`` are not evicted. With ``namespace`` under a quota, its tenant's
        own blocks go first until the tenant stays within its limit there, counting
        ``quota_pending`` bytes it holds there but not yet in the index (reserved
        slots). Raises TierFull when nothing more can go (QuotaExceeded when the
        quota is what cannot be met)."""
        if namespace and self.quotas:
            await self._within_quota(namespace, tier_name, size + quota_pending, extra)
        tier = self.tiers[tier_name]
        if tier.can_fit(size):
            return
        check_size(tier_name, tier.capacity_bytes, size)  # BlockTooLargeForTier
        protected = Protected(self, extra)
        for _ in range(_MAX_EVICTION_ROUNDS):
            need = max(size - (tier.capacity_bytes - tier.used_bytes), 1)
            now = self.clock()
            victims = self._victims(tier_name, need, protected, now)
            if not victims:
                break
            await self._evict(victims, tier_name, now, extra)
            if tier.can_fit(size):
                return
        raise TierFull(
            f"tier {tier_name!r} is full ({tier.used_bytes}/{tier.capacity_bytes} bytes) "
            f"and nothing evictable frees {size} bytes: the rest is pinned or in flight")

    def _victims(self, tier_name: str, need: int, protected: Protected,
                 now: float) -> Sequence[Hashable] | None:
        """The policy's victims with retained blocks shielded; when it finds none, the
        retained blocks that must go (the oldest deadline first), as few as the
        unshielded bytes leave short."""
        retention = self.retention
        shield = retention.shield(tier_name, self.index, now) if retention else frozenset()
        victims: Sequence[Hashable] | None = self.policy.evict(
            tier_name, need, Shielded(protected, shield) if shield else protected, now)
        if victims or not shield:
            return victims
        index = self.index
        shielded = sum(e.meta.size for k in shield if (e := index.get(k)) is not None)
        short = need - (self.tiers[tier_name].used_bytes - shielded)
        return retention.victims(tier_name, index, max(short, 1), protected, now)

    def fits_quota(self, namespace: str, tier_name: str, size: int) -> bool:
        return not self.quotas or self.quotas.excess(namespace, tier_name, size) == 0

    async def _within_quota(self, namespace: str, tier_name: str, size: int,
                            extra: Container[Hashable]) -> None:
        """Evict the tenant's own blocks from the tier (the policy picks them, every other
        tenant's protected) until ``size`` more bytes keep it within its quota there."""
        quotas = self.quotas
        found = quotas.limit(namespace, tier_name)
        if found is None:
            return
        quota, limit = found
        counter = (quota.prefix, tier_name)
        if size <= limit:
            protected = OtherTenants(Protected(self, extra), quotas, quota)
            for _ in range(_MAX_EVICTION_ROUNDS):
                need = quotas.excess(namespace, tier_name, size)
                if need <= 0:
                    return
                now = self.clock()
                victims = self.policy.evict(tier_name, need, protected, now)
                if not victims:
                    break
                quotas.evictions[counter] += await self._evict(victims, tier_name, now, extra)
            if quotas.excess(namespace, tier_name, size) <= 0:
                return
        quotas.refused[counter] += 1
        raise QuotaExceeded(
            f"namespace {namespace!r} is at its quota in tier {tier_name!r} (prefix "
            f"{quota.prefix!r}: {quotas.used(quota, tier_name)}/{limit} bytes) and none of "
            f"its own blocks there can make room for {size} bytes")

    async def _evict(self, victims: Sequence[Hashable], tier_name: str, now: float,
                     extra: Container[Hashable] = ()) -> int:
        """Demote the victims where the policy says, parents first (so the slower tier
        announces a chain head first), then drop them here, children first (so this
        tier's chains shrink from their ends). The room a demotion makes below spares
        ``extra`` too. Returns how many were dropped here."""
        # Victims were chosen before the awaits below: skip any that became pinned or
        # started moving since.
        keys = [k for k in victims if isinstance(k, BlockKey) and not self.is_protected(k)]
        dropped = 0
        for key in reversed(keys):
            entry = self.index.get(key)
            if entry is None or tier_name not in entry.tiers:
                continue
            dst = self.policy.demote_to(key, tier_name, now)
            if self.retention.active(key, now):
                self.retention.evicted += 1
                dst = dst or self._next_tier(tier_name)  # retained: demoted, never dropped
            if dst is not None and dst not in entry.tiers:
                try:
                    await self.copy(entry, tier_name, dst, extra)
                except Exception as exc:  # a failed demotion degrades to a drop: said so
                    self.stats.demotions_failed += 1
                    self.health.copy_failed("demotion (the block is dropped)", key,
                                            tier_name, dst, exc, demotion=True)
        for key in keys:
            entry = self.index.get(key)
            if entry is None or tier_name not in entry.tiers:
                self.policy.on_remove(key, tier_name)
                continue
            if key in self._in_flight:
                continue  # another copy of it started meanwhile; leave it, evict others
            self.stats.evictions[tier_name] += 1
            dropped += 1
            await self._drop(key, tier_name)
        return dropped
