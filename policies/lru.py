"""LRU, vLLM's default: evict the least recently used block of the tier."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Sequence

from kvstore.policies.base import BlockInfo, Policy, TierSpec


class LRUPolicy(Policy):
    name = "lru"

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self._lru: dict[str, OrderedDict[Hashable, int]] = {t.name: OrderedDict() for t in tiers}

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self._lru[tier][info.key] = info.size
        self._lru[tier].move_to_end(info.key)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        try:
            self._lru[tier].move_to_end(key)
        except KeyError:
            pass

    def on_remove(self, key: Hashable, tier: str) -> None:
        self._lru[tier].pop(key, None)

    def evict(
        self, tier: str, nbytes: int, protected: Container[Hashable], now: float
    ) -> list[Hashable] | None:
        victims: list[Hashable] = []
        freed = 0
        for key, size in self._lru[tier].items():
            if freed >= nbytes:
                break
            if key in protected:
                continue
            victims.append(key)
            freed += size
        return victims if freed >= nbytes else None
