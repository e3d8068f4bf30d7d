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
none at once: it ends at the next request, store, hint or victim walk, and its
block goes back to its place in the LRU order.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator, Sequence

from kvstore.policies.base import BlockInfo, Hint, Move, Plan, Policy, RequestInfo, TierSpec

__all__ = ["TTLPolicy"]


class _Tier:
    """One tier's LRU order with holds taken out of it.

    The LRU order is a stamp per block (a larger one each time a block moves to the
    hot end, a smaller one each time one goes to the cold end). Unheld blocks are in
    ``free`` in that order, so a victim walk never passes over held ones (it did: the
    held blocks of the tool-calling sessions sat at the cold end and every eviction
    walked past all of them, 69% of a served replay's time). A hold that ends puts its
    block back where its stamp says: into ``back`` (sorted by stamp, merged into the
    walk), folded into ``free`` once it grows."""

    __slots__ = ("_hi", "_lo", "back", "capacity", "free", "heap", "held", "held_bytes",
                 "lru", "stamp", "used")

    #: ``back`` is folded into ``free`` past this many blocks and an eighth of ``free``.
    FOLD = 32

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: dict[Hashable, int] = {}  # every block -> size
        self.used = 0
        self.stamp: dict[Hashable, int] = {}
        self.free: OrderedDict[Hashable, None] = OrderedDict()
        self.back: list[tuple[int, Hashable]] = []
        self.held: dict[Hashable, float] = {}  # key -> held until
        self.heap: list[tuple[float, int, Hashable]] = []
        self.held_bytes = 0
        self._hi = 0
        self._lo = 0

    # -- the LRU order ---------------------------------------------------------------
    def _leave(self, key: Hashable) -> None:
        """Take an unheld block out of the order (held or removed next)."""
        if self.free.pop(key, 0) is None:
            return
        back = self.back
        i = bisect_left(back, (self.stamp[key],))
        if i < len(back) and back[i][1] == key:
            del back[i]

    def insert(self, key: Hashable, size: int) -> None:
        self.lru[key] = size
        self.used += size
        self._hi += 1
        self.stamp[key] = self._hi
        self.free[key] = None

    def to_hot_end(self, key: Hashable) -> None:
        self._hi += 1
        if key not in self.held:
            self._leave(key)
            self.free[key] = None
        self.stamp[key] = self._hi

    def to_cold_end(self, key: Hashable) -> None:
        """Unheld, at the cold end."""
        if not self.unhold(key):
            self._leave(key)
        self._lo -= 1
        self.stamp[key] = self._lo
        self.free[key] = None
        self.free.move_to_end(key, last=False)

    def remove(self, key: Hashable) -> int | None:
        if key not in self.lru:
            return None
        if not self.unhold(key):
            self._leave(key)
        del self.stamp[key]
        size = self.lru.pop(key)
        self.used -= size
        return size

    def order(self) -> Iterator[Hashable]:
        """Unheld blocks, coldest first."""
        back = self.back
        if not back:
            yield from self.free
            return
        stamp = self.stamp
        i, n = 0, len(back)
        for k in self.free:
            s = stamp[k]
            while i < n and back[i][0] < s:
                yield back[i][1]
                i += 1
            yield k
        while i < n:
            yield back[i][1]
            i += 1

    # -- holds -------------------------------------------------------------------------
    def hold(self, key: Hashable, until: float, tick: int) -> None:
        if not self.unhold(key):
            self._leave(key)
        self.held[key] = until
        self.held_bytes += self.lru[key]
        heapq.heappush(self.heap, (until, tick, key))

    def unhold(self, key: Hashable) -> bool:
        """End ``key``'s hold, if it has one (the caller places the block)."""
        if self.held.pop(key, None) is None:
            return False
        self.held_bytes -= self.lru.get(key, 0)
        return True

    def expire(self, now: float) -> None:
        heap, held = self.heap, self.held
        returned = False
        while heap and heap[0][0] <= now:
            until, _, key = heapq.heappop(heap)
            if held.get(key) == until:
                del held[key]
                self.held_bytes -= self.lru.get(key, 0)
                insort(self.back, (self.stamp[key], key))
                returned = True
        if returned and len(self.back) > max(self.FOLD, len(self.free) >> 3):
            self._fold()

    def _fold(self) -> None:
        merged: OrderedDict[Hashable, None] = OrderedDict()
        for k in self.order():
            merged[k] = None
        self.free = merged
        self.back = []


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
                self._tick += 1
                tr.hold(k, now + self.ttl_s, self._tick)
            elif hint.event == "turn_end":
                tr.to_cold_end(k)
        return []

    # -- bookkeeping --------------------------------------------------------------------
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        tr = self._t[tier]
        tr.expire(now)
        if info.key not in tr.lru:
            tr.insert(info.key, info.size)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        tr = self._t[tier]
        if key in tr.lru:
            tr.to_hot_end(key)

    def on_remove(self, key: Hashable, tier: str) -> None:
        self._t[tier].remove(key)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterator[Hashable]:
        """Unheld blocks (a hold past its deadline is none: it ends now) in LRU order,
        then held ones by expiry."""
        tr = self._t[tier]
        tr.expire(now)
        yield from tr.order()
        held = tr.held
        yield from sorted(held, key=held.__getitem__)
