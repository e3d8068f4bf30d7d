"""LRU, vLLM's default: evict the least recently used block of the tier.

Victims still go children first (:mod:`kvstore.policies._prefix`): with the
engine's tail-first touch order a child is always older than its parent, so
this only matters when blocks arrive out of that order (demotions, hints).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Sequence

from kvstore.policies._prefix import ChildIndex
from kvstore.policies.base import BlockInfo, Policy, TierSpec


class LRUPolicy(Policy):
    name = "lru"

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self._lru: dict[str, OrderedDict[Hashable, int]] = {t.name: OrderedDict() for t in tiers}
        self._index = {t.name: ChildIndex() for t in tiers}

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self._lru[tier][info.key] = info.size
        self._lru[tier].move_to_end(info.key)
        self._index[tier].add(info.key, info.parent, info.size)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        lru = self._lru[tier]
        if key in lru:
            lru.move_to_end(key)

    def on_remove(self, key: Hashable, tier: str) -> None:
        self._lru[tier].pop(key, None)
        self._index[tier].remove(key)

    def evict(
        self, tier: str, nbytes: int, protected: Container[Hashable], now: float
    ) -> list[Hashable] | None:
        return self._index[tier].take(self._lru[tier].items(), nbytes, protected)
