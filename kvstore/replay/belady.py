"""Belady's offline optimum for one tier of the total capacity (replay only).

On a miss with a full cache, evict the block whose next request lies furthest
in the future (never-again blocks first; ties go to the least recently used).
With ``bypass=True`` a missed block needed later than every cached one is not
stored at all: the optimum for caches that may refuse admission, and so the
bound for policies that do (``workload`` does). The published figures for the
conversation trace are the classic form (``bypass=False``). Blocks are counted,
not bytes. Needs the whole future, so it lives here and never among the policies.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from kvstore.replay.trace import Request

__all__ = ["belady_hit_rate"]

_NEVER = 1 << 62


def _next_use(requests: Sequence[Request]) -> list[list[int]]:
    nxt: list[list[int]] = [[] for _ in requests]
    last: dict[int, int] = {}
    for i in range(len(requests) - 1, -1, -1):
        h = requests[i].hash_ids
        nxt[i] = [last.get(x, _NEVER) for x in h]
        for x in h:
            last[x] = i
    return nxt


def belady_hit_rate(requests: Sequence[Request], capacity_blocks: int,
                    bypass: bool = False) -> float:
    """Prefix hit rate (hit blocks / looked-up blocks) of the offline optimum."""
    if capacity_blocks < 1:
        raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
    nxt = _next_use(requests)
    cache: dict[int, tuple[int, int]] = {}
    heap: list[tuple[int, int, int]] = []
    tick = itertools.count()
    hits = 0
    total = 0
    for i, req in enumerate(requests):
        h = req.hash_ids
        total += len(h)
        for x in h:
            if x not in cache:
                break
            hits += 1
        for x, nu in zip(h, nxt[i], strict=True):
            stamp = (nu, next(tick))
            if x not in cache and len(cache) >= capacity_blocks:
                while True:
                    neg, t, y = heap[0]
                    if cache.get(y) == (-neg, t):
                        break
                    heapq.heappop(heap)
                if bypass and nu >= -neg:
                    continue  # x is needed no sooner than the furthest cached block
                heapq.heappop(heap)
                del cache[y]
            cache[x] = stamp
            heapq.heappush(heap, (-nu, stamp[1], x))
    return hits / total if total else 0.0
