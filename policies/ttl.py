"""Tool-call TTL: the baseline that uses hints with a fixed rule (Continuum's TTL
pins on tool calls, later CacheTTL).

LRU, except:

* after a ``tool_call`` hint the session's blocks are *held* for ``ttl_s``
  (60 s): they are evicted last, and a new request's blocks bypass the top tier
  rather than evict them (admitted only while unheld blocks or free room can
  make space); a block refused from the top tier still enters the next tier
  (the rule protects the fast tier, it does not drop the block);
* after a user turn (``turn_end``) the session's blocks go to the cold end of
  the LRU order and lose any hold;
* at ``session_end`` its blocks are dropped.

No learning: the hold is the same for every tool and workload. It is what
``workload`` must beat with what it learns. A hold past its deadline counts as
none at once (:meth:`TTLPolicy.victims` reads it so); it is cleared from the
books at the next request, store or hint.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator, Sequence

from kvstore.policies.base import BlockInfo, Hint, Move, Plan, Policy, RequestInfo, TierSpec

__all__ = ["TTLPolicy"]


class _Tier:
    __slots__ = ("capacity", "held", "heap", "held_bytes", "lru", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: OrderedDict[Hashable, int] = OrderedDict()
        self.used = 0
        self.held: dict[Hashable, float] = {}  # key -> held until
        self.heap: list[tuple[float, int, Hashable]] = []
        self.held_bytes = 0

    def expire(self, now: float) -> None:
        heap, held = self.heap, self.held
        while heap and heap[0][0] <= now:
            until, _, key = heapq.heappop(heap)
            if held.get(key) == until:
                del held[key]
                self.held_bytes -= self.lru.get(key, 0)

    def unhold(self, key: Hashable) -> None:
        if self.held.pop(key, None) is not None:
            self.held_bytes -= self.lru.get(key, 0)


class TTLPolicy(Policy):
    name = "ttl"

    def __init__(self, tiers: Sequence[TierSpec], ttl_s: float = 60.0) -> None:
        super().__init__(tiers)
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._t = {t.name: _Tier(t.capacity_bytes) for t in tiers}
        self._tick = 0

    # -- placement ------------------------------------------------------------------
    def on_request(self, req: RequestInfo, now: float) -> Plan:
        top = self.tiers[0].name
        tr = self._t[top]
        tr.expire(now)
        room = tr.capacity - tr.held_bytes  # free bytes + what unheld blocks can give up
        lower = self.tiers[1].name if len(self.tiers) > 1 else None
        admit: dict[Hashable, str] = {}
        bypass = False
        for k, t in zip(req.keys, req.hit_tiers, strict=True):
            if t is not None:
                continue
            if bypass or room < req.block_bytes:
                bypass = True  # the rest would evict held blocks: not into the top tier
                if lower is not None:
                    admit[k] = lower
                continue
            admit[k] = top
            room -= req.block_bytes
        return Plan(admit)

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        if hint.event == "session_end":
            return [Move(k, t, None) for k, t in keys]
        for k, t in keys:
            tr = self._t[t]
            tr.expire(now)
            if k not in tr.lru:
                continue
            if hint.event == "tool_call":
                tr.unhold(k)
                until = now + self.ttl_s
                tr.held[k] = until
                tr.held_bytes += tr.lru[k]
                self._tick += 1
                heapq.heappush(tr.heap, (until, self._tick, k))
            elif hint.event == "turn_end":
                tr.unhold(k)
                tr.lru.move_to_end(k, last=False)  # the cold end
        return []

    # -- bookkeeping --------------------------------------------------------------------
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        tr = self._t[tier]
        tr.expire(now)
        if info.key in tr.lru:
            return
        tr.lru[info.key] = info.size
        tr.used += info.size

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        tr = self._t[tier]
        if key in tr.lru:
            tr.lru.move_to_end(key)

    def on_remove(self, key: Hashable, tier: str) -> None:
        tr = self._t[tier]
        tr.unhold(key)
        size = tr.lru.pop(key, None)
        if size is not None:
            tr.used -= size

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterator[Hashable]:
        """Unheld blocks (a hold past its deadline is none) in LRU order, then held
        ones by expiry."""
        held = self._t[tier].held
        for k in self._t[tier].lru:
            until = held.get(k)
            if until is None or until <= now:
                yield k
        yield from sorted((k for k, until in held.items() if until > now),
                          key=held.__getitem__)
