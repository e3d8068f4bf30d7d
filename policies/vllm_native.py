"""vLLM's native CPU offloading as it ships, as baselines: LRU or ARC behind
``store_threshold`` 2.

vLLM's ``OffloadingConnector`` keeps offloaded blocks under a ``CachePolicy``
(``vllm/v1/kv_offload/cpu/policies``: ``lru`` or ``arc``), and its
``FilterReusedOffloadingManager`` decorator stores a block only once its hash has
been looked up ``store_threshold`` times (2: on its second sighting), counting in an
LRU table of at most 64,000 hashes. Here the same two pieces are the existing
:class:`~kvstore.policies.filter.AdmissionFilter` (counts lookups, bounded, forgets
the oldest) around :class:`~kvstore.policies.lru.LRUPolicy` or :class:`ARCPolicy`.

:class:`ARCPolicy` follows vLLM's ``ARCCachePolicy``: new blocks enter T1, a hit
moves a T1 block to T2 (a T2 block to its MRU end); a lookup of a block remembered
in ghost list B1 (evicted from T1) grows T1's target by ``max(1, |B2| / |B1|)``, one
in B2 shrinks it by ``max(1, |B1| / |B2|)``; victims come from T1 while T1 holds at
least its target, else from T2, and go to B1 or B2; each ghost list keeps at most
the tier's capacity in blocks. A block leaving the tier goes to the ghost list of the
queue it left (the engine's eviction manager, :mod:`kvstore.engine.eviction`, takes
the victims in ARC's order, children before parents, as for every policy).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Any, Self

from kvstore.policies.base import BlockInfo, Plan, Policy, PolicyConfig, RequestInfo, TierSpec
from kvstore.policies.filter import AdmissionFilter
from kvstore.policies.lru import LRUPolicy

__all__ = ["STORE_THRESHOLD", "TRACKER_SIZE", "ARCPolicy", "VLLMNativeARC", "VLLMNativeLRU"]

#: vLLM's defaults for ``FilterReusedOffloadingManager``.
STORE_THRESHOLD = 2
TRACKER_SIZE = 64_000


class _ARC:
    __slots__ = ("b1", "b2", "blocks", "capacity", "t1", "t2", "target")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # bytes
        self.blocks = 1  # capacity in blocks (from the sizes seen)
        self.target = 0.0  # T1's target size, blocks
        self.t1: OrderedDict[Hashable, int] = OrderedDict()
        self.t2: OrderedDict[Hashable, int] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()

    def order(self) -> Iterator[Hashable]:
        """Candidates in ARC's order: T1 while it holds its target, then T2, then what
        is left of T1. (T1 gives its oldest until what it has left is under the target:
        all of it with a target of 0, else ``len(T1) - target + 1`` blocks; one chain of
        C iterators, read lazily.)"""
        n, target = len(self.t1), int(self.target)
        first = n if target <= 0 else min(n, max(0, n - target + 1))
        t1 = iter(self.t1)
        return chain(islice(t1, first), self.t2, t1)


class ARCPolicy(Policy):
    name = "arc"

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self._t = {t.name: _ARC(t.capacity_bytes) for t in tiers}
        #: blocks stored since the last lookup: the engine touches what it just stored,
        #: which is no second use (vLLM's ``is_ready`` check keeps them in T1)
        self._fresh: set[Hashable] = set()

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        """vLLM's touch of a request's blocks, for the ones no tier holds: a block
        remembered in a ghost list moves T1's target."""
        self._fresh.clear()
        for arc in self._t.values():
            for k in reversed(req.keys):
                if k in arc.t1 or k in arc.t2:
                    continue
                if k in arc.b1:
                    arc.target = min(arc.target + max(1.0, len(arc.b2) / len(arc.b1)),
                                     float(arc.blocks))
                    arc.b1.move_to_end(k)
                elif k in arc.b2:
                    arc.target = max(arc.target - max(1.0, len(arc.b1) / len(arc.b2)), 0.0)
                    arc.b2.move_to_end(k)
        return super().on_request(req, now)

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        arc = self._t[tier]
        if info.key in arc.t1 or info.key in arc.t2:
            return
        arc.t1[info.key] = info.size
        self._fresh.add(info.key)
        arc.b1.pop(info.key, None)
        arc.b2.pop(info.key, None)
        arc.blocks = max(1, arc.capacity // max(info.size, 1))

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        arc = self._t[tier]
        if key in self._fresh and key in arc.t1:
            arc.t1.move_to_end(key)  # stored by this request: not a second use
            return
        size = arc.t1.pop(key, None)
        if size is not None:
            arc.t2[key] = size
        elif key in arc.t2:
            arc.t2.move_to_end(key)

    def on_remove(self, key: Hashable, tier: str) -> None:
        """The block left the tier (an eviction, mostly): remember which queue it was
        in, as ARC's eviction does."""
        arc = self._t[tier]
        if arc.t1.pop(key, None) is not None:
            ghost = arc.b1
        elif arc.t2.pop(key, None) is not None:
            ghost = arc.b2
        else:
            return
        ghost[key] = None
        while len(ghost) > arc.blocks:
            ghost.popitem(last=False)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterable[Hashable]:
        return self._t[tier].order()


class VLLMNativeLRU(AdmissionFilter):
    """vLLM's CPU offloading with its LRU policy and ``store_threshold`` 2."""

    name = "vllm-lru"

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        options.setdefault("threshold", STORE_THRESHOLD)
        options.setdefault("max_tracked", TRACKER_SIZE)
        return cls(LRUPolicy(config.tiers), **options)


class VLLMNativeARC(AdmissionFilter):
    """vLLM's CPU offloading with its ARC policy and ``store_threshold`` 2."""

    name = "vllm-arc"

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        options.setdefault("threshold", STORE_THRESHOLD)
        options.setdefault("max_tracked", TRACKER_SIZE)
        return cls(ARCPolicy(config.tiers), **options)
