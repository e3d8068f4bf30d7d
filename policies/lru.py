"""LRU, vLLM's default: evict the least recently used block of the tier.

The whole eviction contract (see :mod:`kvstore.policies.base`): one ordered
dict per tier, oldest first. Children-first, protection and atomicity are the
engine's eviction manager's (:mod:`kvstore.engine.eviction`), as for every
policy; placement keeps the defaults (admit into the fastest tier, demote one
level).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container, Hashable, Iterable, Sequence
from itertools import islice
from typing import Any

from kvstore.policies.base import BlockInfo, Policy, TierSpec


def _at_the_end(order: OrderedDict[Hashable, Any], keys: Sequence[Hashable]) -> bool:
    """Whether ``keys`` are the last ones of ``order``, in order (moving each to the
    end would leave it as it is): one C-level read of the tail and a comparison that
    finds the same objects (a lookup's keys are the stored ones)."""
    n = len(keys)
    if n > len(order):
        return False
    tail = list(islice(reversed(order), n))
    tail.reverse()
    return tail == keys


class LRUPolicy(Policy):
    name = "lru"

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self._lru: dict[str, OrderedDict[Hashable, None]] = {t.name: OrderedDict() for t in tiers}

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self._lru[tier][info.key] = None
        self._lru[tier].move_to_end(info.key)

    def on_insert_many(self, infos: Sequence[BlockInfo], tier: str, now: float) -> None:
        if type(self).on_insert is not LRUPolicy.on_insert:  # a subclass's own insert
            super().on_insert_many(infos, tier, now)
            return
        lru = self._lru[tier]
        move = lru.move_to_end
        for info in infos:
            lru[info.key] = None
            move(info.key)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        lru = self._lru[tier]
        if key in lru:
            lru.move_to_end(key)

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        lrus = self._lru
        if keys and len(keys) == len(tiers) and tiers.count(tiers[0]) == len(tiers):
            lru = lrus[tiers[0]]  # one tier (a lookup's hits, mostly): one pass
            if _at_the_end(lru, keys):
                return  # (touched last, in this order: the moves would change nothing)
            try:
                deque(map(lru.move_to_end, keys), 0)
                return
            except KeyError:
                pass  # one not held: the loop below makes every move again, in order
        for key, tier in zip(keys, tiers, strict=True):
            lru = lrus[tier]
            if key in lru:
                lru.move_to_end(key)

    def on_remove(self, key: Hashable, tier: str) -> None:
        self._lru[tier].pop(key, None)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterable[Hashable]:
        return iter(self._lru[tier])
