"""One tier's blocks in expiry order, a cached parent never expiring before its child.

The workload policy gives every block an expiry (its last use plus its class's
hold time). :class:`ExpiryLedger` keeps one tier's blocks by it: the earliest
expiry, victims in expiry order (a lazy heap whose stale entries are dropped as
they surface), children before parents (:class:`ChildIndex`), and the prefix
rule: a cached ancestor lives at least as long as any cached descendant (a
prefix is worth only as much as its head is kept). A child stored before its
parent (tail first, as vLLM frees) leaves the expiry it asks for pending until
the parent arrives.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Container, Hashable, Iterator
from typing import Any

from kvstore.policies._prefix import ChildIndex

__all__ = ["ExpiryLedger"]

_PENDING_MAX = 4096


class ExpiryLedger:
    """Blocks of one tier: ``meta`` (the policy's class, last use, size), ``used`` bytes."""

    __slots__ = ("_expiry", "_heap", "_index", "_parent", "_pending", "_seq", "capacity",
                 "meta", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.meta: dict[Hashable, tuple[Any, float, int]] = {}
        self._expiry: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable]] = []  # (expiry, seq, key), lazy
        self._parent: dict[Hashable, Hashable | None] = {}
        self._pending: dict[Hashable, float] = {}
        self._index = ChildIndex()
        self._seq = itertools.count()

    def __contains__(self, key: object) -> bool:
        return key in self.meta

    def add(self, key: Hashable, parent: Hashable | None, meta: tuple[Any, float, int],
            expiry: float) -> None:
        self.meta[key] = meta
        self.used += meta[2]
        self._parent[key] = parent
        self._index.add(key, parent, meta[2])
        self.set_expiry(key, expiry)

    def remove(self, key: Hashable) -> bool:
        m = self.meta.pop(key, None)
        if m is None:
            return False
        self.used -= m[2]
        self._expiry.pop(key, None)
        self._parent.pop(key, None)
        self._pending.pop(key, None)
        self._index.remove(key)
        return True

    def expiry(self, key: Hashable, default: float) -> float:
        return self._expiry.get(key, default)

    def set_expiry(self, key: Hashable, e: float) -> None:
        """``key`` expires at ``e`` (or later, if a child asked for more); cached
        ancestors are extended to live at least as long."""
        e = max(e, self._pending.pop(key, e))
        self._set(key, e)
        p = self._parent.get(key)
        while p is not None and p in self._expiry:
            if self._expiry[p] >= e:
                return
            self._set(p, e)
            p = self._parent.get(p)
        if p is not None and self._pending.get(p, e - 1.0) < e:
            self._pending[p] = e
            if len(self._pending) > _PENDING_MAX:
                self._pending.clear()

    def _set(self, key: Hashable, e: float) -> None:
        self._expiry[key] = e
        heapq.heappush(self._heap, (e, next(self._seq), key))

    def earliest(self) -> float:
        """The earliest expiry (inf when empty)."""
        heap = self._heap
        while heap and self._expiry.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else float("inf")

    def take(self, nbytes: int, protected: Container[Hashable]) -> list[Hashable] | None:
        """Victims for ``nbytes`` in expiry order, children before parents (None: not
        enough unprotected blocks). Candidates not taken stay queued."""
        popped: list[tuple[float, int, Hashable]] = []
        victims = self._index.take(self._candidates(popped), nbytes, protected)
        chosen = set(victims or ())
        for entry in popped:
            if entry[2] not in chosen:
                heapq.heappush(self._heap, entry)
        return victims

    def _candidates(self, popped: list[tuple[float, int, Hashable]]
                    ) -> Iterator[tuple[Hashable, int]]:
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            key = entry[2]
            if self._expiry.get(key) != entry[0]:
                continue
            popped.append(entry)
            yield key, self.meta[key][2]
