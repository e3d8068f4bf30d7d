"""What this sidecar holds in the shared Redis: sizes, chunk counts and TTL deadlines.

Redis is shared by many sidecars, so its own memory figures say nothing about
one of them. The redis tier's ``used_bytes`` is this ledger's total: the
payload bytes of the blocks this sidecar wrote or adopted and has not seen
deleted, missing, or past their TTL. Deadlines sit in a lazy heap: a renewed
TTL pushes a new entry and the stale one is skipped when it surfaces.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from kvstore.types import BlockKey

__all__ = ["Held", "Ledger"]


@dataclass(slots=True)
class Held:
    size: int
    chunks: int
    #: When Redis drops it (monotonic seconds); ``inf`` without a TTL.
    deadline: float
    #: The TTL it gets when renewed (<= 0: none).
    ttl: float = 0.0


class Ledger:
    def __init__(self) -> None:
        self.blocks: dict[BlockKey, Held] = {}
        self.used = 0
        self._heap: list[tuple[float, int, BlockKey]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, key: BlockKey) -> Held | None:
        return self.blocks.get(key)

    def set(self, key: BlockKey, size: int, chunks: int, deadline: float,
            ttl: float = 0.0) -> None:
        old = self.blocks.get(key)
        if old is not None:
            self.used -= old.size
        self.blocks[key] = Held(size, chunks, deadline, ttl)
        self.used += size
        self._push(key, deadline)

    def renew(self, key: BlockKey, deadline: float, ttl: float | None = None) -> None:
        held = self.blocks.get(key)
        if held is None:
            return
        if ttl is not None:
            held.ttl = ttl
        if deadline != held.deadline:
            held.deadline = deadline
            self._push(key, deadline)

    def pop(self, key: BlockKey) -> Held | None:
        held = self.blocks.pop(key, None)
        if held is not None:
            self.used -= held.size
        return held

    def expired(self, now: float) -> list[BlockKey]:
        """Remove and return the blocks whose deadline has passed."""
        out: list[BlockKey] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, key = heapq.heappop(heap)
            held = self.blocks.get(key)
            if held is not None and held.deadline <= now:
                self.pop(key)
                out.append(key)
        return out

    def clear(self) -> None:
        self.blocks.clear()
        self._heap.clear()
        self.used = 0

    def _push(self, key: BlockKey, deadline: float) -> None:
        if math.isinf(deadline):
            return
        heapq.heappush(self._heap, (deadline, next(self._seq), key))
        if len(self._heap) > 2 * len(self.blocks) + 1024:  # drop stale entries
            self._heap = [(h.deadline, next(self._seq), k) for k, h in self.blocks.items()
                          if not math.isinf(h.deadline)]
            heapq.heapify(self._heap)
