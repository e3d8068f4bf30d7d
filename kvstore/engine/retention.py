"""Retention: a client's statement that a prefix is used again within a TTL.

Like Anthropic's ``cache_control`` or Mooncake's ``guaranteed_until``, and soft:
the engine's eviction path (:meth:`kvstore.engine.placement.Placement.make_room`)
applies it once, for every policy:

* a retained block (its deadline not passed) whose tenant is within its retention
  quota in the tier is shielded from the policy's victims there, so everything
  unretained of the tier goes first;
* when nothing else can go, retained blocks go too, the oldest deadline first
  (never a hard pin: a tier full of retained blocks still takes new puts), and a
  retained victim is demoted to the next tier even where the policy would drop it;
* the policy's own drops (a session's end, a between-turn drop) skip a shielded block;
* past its deadline a block is an ordinary block again.

A tenant is the namespace's ``[[quotas]]`` prefix, or the namespace itself. Its
retention quota is bytes per tier; :meth:`Retention.retain` protects no block that
would take the tenant past it in a tier the block is in, and a tenant past it (its
retained blocks moved down into a tier where they do not fit) is not shielded
there. A block asked for before it is stored (a request's blocks, retained as the
request finishes while its saves still land) is protected when it is stored, if it
fits the quota then.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Container, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvstore.engine.index import Entry, Index
from kvstore.errors import InvalidArgument
from kvstore.types import BlockKey

__all__ = ["Retention", "RetentionLimits", "RetentionUsage", "Shielded"]

#: Blocks asked for before they are stored, remembered at most (past it such an ask
#: protects nothing: a client cannot grow the server's memory with hashes it never stores).
MAX_PENDING = 1 << 18


@dataclass(frozen=True, slots=True)
class RetentionLimits:
    """The longest TTL a client may ask for and each tenant's quota per tier.

    ``bytes_per_tier``: tier name -> bytes a tenant may retain there; a tier not
    named gets ``fraction`` of its capacity."""

    max_ttl_s: float = 3600.0
    bytes_per_tier: Mapping[str, int] = field(default_factory=dict)
    fraction: float = 0.5


@dataclass(frozen=True, slots=True)
class RetentionUsage:
    """One (tenant, tier) as Stats and /metrics report it."""

    tenant: str
    tier: str
    retained_bytes: int
    limit_bytes: int


class Retention:
    """Deadlines of retained blocks, the quota check, the shield and the fallback order."""

    def __init__(self, limits: RetentionLimits, capacity: Mapping[str, int],
                 tenant_of: Callable[[str], str]) -> None:
        self.limits = limits
        self._limit = {t: limits.bytes_per_tier.get(t) or int(limits.fraction * cap)
                       for t, cap in capacity.items()}
        self._tenant_of = tenant_of
        #: key -> (deadline, order): active retentions (the block is stored)
        self._until: dict[BlockKey, tuple[float, int]] = {}
        #: key -> deadline: asked for before the block was stored
        self._pending: dict[BlockKey, float] = {}
        self._seq = itertools.count()
        #: blocks a retain protected (each grant counted once per block and deadline)
        self.granted = 0
        #: blocks a retain could not protect (the tenant's quota)
        self.refused = 0
        #: lookups that found a block while it was retained (the retention paid off)
        self.returned = 0
        #: retained blocks evicted before their deadline (the tier had nothing else)
        self.evicted = 0
        #: distinct blocks retained (an extension of a live retention not counted again),
        #: and how many of them a lookup found while they were retained (came back)
        self.blocks = 0
        self.came_back = 0
        self._hit: set[BlockKey] = set()

    def __bool__(self) -> bool:
        return bool(self._until)

    def limit(self, tier: str) -> int:
        return self._limit.get(tier, 0)

    def check_ttl(self, ttl_s: float) -> float:
        if not isinstance(ttl_s, int | float) or isinstance(ttl_s, bool) or not math.isfinite(
                ttl_s) or ttl_s < 0:
            raise InvalidArgument(f"ttl_s must be a number of seconds >= 0, got {ttl_s!r}")
        if ttl_s > self.limits.max_ttl_s:
            raise InvalidArgument(
                f"ttl_s {ttl_s:g} exceeds the longest retention this server grants "
                f"(retention.max_ttl_s = {self.limits.max_ttl_s:g} seconds)")
        return float(ttl_s)

    # -- state --------------------------------------------------------------------------
    def active(self, key: Hashable, now: float) -> bool:
        """Whether ``key`` is retained now (its deadline not passed)."""
        got = self._until.get(key)  # type: ignore[call-overload]
        return got is not None and got[0] > now

    def deadline(self, key: BlockKey) -> float | None:
        got = self._until.get(key)
        return got[0] if got is not None else None

    def retained_bytes(self, index: Index, now: float) -> Counter[tuple[str, str]]:
        """(tenant, tier) -> bytes of its retained blocks stored there now."""
        used: Counter[tuple[str, str]] = Counter()
        for key, (until, _) in self._until.items():
            if until <= now:
                continue
            entry = index.get(key)
            if entry is None:
                continue
            tenant = self._tenant_of(key.namespace)
            for tier in entry.tiers:
                used[(tenant, tier)] += entry.meta.size
        return used

    def usage(self, index: Index, now: float) -> list[RetentionUsage]:
        used = self.retained_bytes(index, now)
        return [RetentionUsage(tenant, tier, n, self.limit(tier))
                for (tenant, tier), n in sorted(used.items())]

    # -- retain ---------------------------------------------------------------------------
    def retain(self, keys: Sequence[BlockKey], index: Index, ttl_s: float, now: float) -> int:
        """Retain ``keys`` until ``now + ttl_s`` (``ttl_s`` 0 ends their retention).
        Returns how many of them are protected now (stored, within the quota)."""
        ttl_s = self.check_ttl(ttl_s)
        if ttl_s == 0:
            for key in keys:
                self._until.pop(key, None)
                self._pending.pop(key, None)
            return 0
        until = now + ttl_s
        used = self.retained_bytes(index, now)
        protected = 0
        for key in keys:
            entry = index.get(key)
            if entry is None:
                if key in self._pending or len(self._pending) < MAX_PENDING:
                    self._pending[key] = max(until, self._pending.get(key, 0.0))
                continue
            if self._admit(entry, until, used, now):
                protected += 1
        return protected

    def _admit(self, entry: Entry, until: float, used: Counter[tuple[str, str]],
               now: float) -> bool:
        key = entry.key
        held = self._until.get(key)
        if held is not None and held[0] > now:  # already counted in ``used``: extend
            if until > held[0]:
                self._until[key] = (until, held[1])
                self.granted += 1
            return True
        tenant = self._tenant_of(key.namespace)
        size = entry.meta.size
        if any(used[(tenant, t)] + size > self.limit(t) for t in entry.tiers):
            self.refused += 1
            return False
        for t in entry.tiers:
            used[(tenant, t)] += size
        self._until[key] = (until, next(self._seq))
        self._hit.discard(key)
        self.granted += 1
        self.blocks += 1
        return True

    def on_stored(self, entry: Entry, index: Index, now: float) -> None:
        """A block was stored: protect it if it was asked for before (and fits)."""
        if not self._pending:
            return
        until = self._pending.pop(entry.key, None)
        if until is not None and until > now:
            self._admit(entry, until, self.retained_bytes(index, now), now)

    def on_hit(self, key: BlockKey, now: float) -> None:
        if self.active(key, now):
            self.returned += 1
            if key not in self._hit:
                self._hit.add(key)
                self.came_back += 1

    def forget(self, key: BlockKey) -> None:
        self._hit.discard(key)
        self._until.pop(key, None)
        self._pending.pop(key, None)

    def expire(self, now: float) -> int:
        """Forget retentions whose deadline passed. Returns how many."""
        gone = [k for k, (until, _) in self._until.items() if until <= now]
        for k in gone:
            del self._until[k]
            self._hit.discard(k)
        for k in [k for k, until in self._pending.items() if until <= now]:
            del self._pending[k]
        return len(gone)

    # -- eviction -------------------------------------------------------------------------
    def shield(self, tier: str, index: Index, now: float) -> frozenset[BlockKey]:
        """The blocks of ``tier`` the policy may not pick: retained, of a tenant within
        its retention quota there."""
        used = self.retained_bytes(index, now)
        limit = self.limit(tier)
        over = {tenant for (tenant, t), n in used.items() if t == tier and n > limit}
        out = []
        for key, (until, _) in self._until.items():
            if until <= now:
                continue
            entry = index.get(key)
            if entry is None or tier not in entry.tiers:
                continue
            if self._tenant_of(key.namespace) not in over:
                out.append(key)
        return frozenset(out)

    def victims(self, tier: str, index: Index, nbytes: int, protected: Container[Hashable],
                now: float) -> list[BlockKey]:
        """Retained blocks of ``tier`` freeing ``nbytes``, the oldest deadline first (a
        chain's children before its parents at one deadline), or as many as there are."""
        found: list[tuple[float, int, BlockKey, int]] = []
        for key, (until, seq) in self._until.items():
            if until <= now or key in protected:
                continue
            entry = index.get(key)
            if entry is not None and tier in entry.tiers:
                found.append((until, -seq, key, entry.meta.size))
        found.sort()
        out: list[BlockKey] = []
        freed = 0
        for _, _, key, size in found:
            if freed >= nbytes:
                break
            out.append(key)
            freed += size
        return out

    def retained_keys(self) -> Iterable[BlockKey]:
        return self._until.keys()


class Shielded(Container[Hashable]):
    """``base`` (pinned, in flight, the request's own) plus the retention shield."""

    __slots__ = ("_base", "_shield")

    def __init__(self, base: Container[Hashable], shield: Container[Hashable]) -> None:
        self._base = base
        self._shield = shield

    def __contains__(self, key: object) -> bool:
        return key in self._shield or key in self._base
