"""S3-FIFO (Yang et al., SOSP'23): a small probation FIFO, a main FIFO, a ghost list.

New blocks enter the small queue (10% of the tier); a block hit while there is
promoted to main on eviction, an unhit one is evicted and remembered in the
ghost list; a block re-inserted while in the ghost list goes straight to main.
Main is a CLOCK-like FIFO: a hit block is re-queued with its count decremented.
Victims always go children first (see :mod:`kvstore.policies._prefix`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator, Sequence

from kvstore.policies._prefix import ChildIndex
from kvstore.policies.base import BlockInfo, Policy, TierSpec

_MAX_FREQ = 3


class _Queues:
    __slots__ = ("capacity", "freq", "ghost", "index", "main", "small", "small_bytes")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.small: OrderedDict[Hashable, int] = OrderedDict()
        self.main: OrderedDict[Hashable, int] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self.freq: dict[Hashable, int] = {}
        self.index = ChildIndex()
        self.small_bytes = 0


class S3FIFOPolicy(Policy):
    name = "s3fifo"

    def __init__(self, tiers: Sequence[TierSpec], small_fraction: float = 0.1,
                 ghost_entries: int = 0) -> None:
        super().__init__(tiers)
        if not 0.0 < small_fraction < 1.0:
            raise ValueError(f"small_fraction must be in (0, 1), got {small_fraction}")
        self._small_fraction = small_fraction
        self._ghost_entries = ghost_entries
        self._q = {t.name: _Queues(t.capacity_bytes) for t in tiers}

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        q = self._q[tier]
        if info.key in q.freq:
            return
        q.freq[info.key] = 0
        q.index.add(info.key, info.parent, info.size)
        if info.key in q.ghost:
            del q.ghost[info.key]
            q.main[info.key] = info.size
        else:
            q.small[info.key] = info.size
            q.small_bytes += info.size

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        q = self._q[tier]
        if key in q.freq:
            q.freq[key] = min(q.freq[key] + 1, _MAX_FREQ)

    def on_remove(self, key: Hashable, tier: str) -> None:
        q = self._q[tier]
        if q.freq.pop(key, None) is None:
            return
        q.index.remove(key)
        size = q.small.pop(key, None)
        if size is not None:
            q.small_bytes -= size
        else:
            q.main.pop(key, None)

    def evict(
        self, tier: str, nbytes: int, protected: Container[Hashable], now: float
    ) -> list[Hashable] | None:
        q = self._q[tier]
        victims = q.index.take(self._candidates(q, protected), nbytes, protected)
        if victims is None:
            return None
        limit = self._ghost_entries or max(16, len(q.freq))
        for key in victims:
            if key in q.small:
                q.ghost[key] = None
        while len(q.ghost) > limit:
            q.ghost.popitem(last=False)
        return victims

    def _candidates(
        self, q: _Queues, protected: Container[Hashable]
    ) -> Iterator[tuple[Hashable, int]]:
        """Yield victims in S3-FIFO order, aging blocks as they are passed over.

        Aging (promotion, count decrement) is the policy's own bookkeeping and
        may happen even when the eviction as a whole fails; the set of cached
        blocks never changes here.
        """
        small_target = self._small_fraction * q.capacity
        passes = 0
        budget = (len(q.small) + len(q.main)) * (_MAX_FREQ + 2) + 1
        skipped = 0  # protected blocks passed over in small: after a full turn, use main
        while (q.small or q.main) and passes < budget:
            passes += 1
            use_small = q.small_bytes >= small_target or not q.main
            if q.small and use_small and skipped < len(q.small):
                key, size = next(iter(q.small.items()))
                q.small.move_to_end(key)
                if key in protected:
                    skipped += 1
                    continue
                if q.freq[key] > 0:
                    del q.small[key]
                    q.small_bytes -= size
                    q.freq[key] = 0
                    q.main[key] = size
                    continue
                yield key, size
            elif q.main:
                key, size = next(iter(q.main.items()))
                q.main.move_to_end(key)
                if q.freq[key] > 0 and key not in protected:
                    q.freq[key] -= 1
                    continue
                yield key, size
            else:
                return
