"""The workload-aware policy: keep what will be back soon, in the tier worth it.

Every block belongs to a *class* built from what the engine can see: workload,
the session's last turn event (tool call with its tool name, user turn,
session end), whether the block is partial (a request's last block, which the
next turn rewrites), whether the request was short (< 8 blocks), how often the
key was used, whether other sessions share it (system prompts, tool schemas)
and how much of the request's prefix was seen before. Per class the policy
learns online how often and how soon blocks come back
(:class:`~kvstore.policies.returns.ReturnModel`); it never sees the future.

A block's value is its hit density (LHD, Beckmann et al., NSDI'18): the chance
it is back within ``window_s`` given how long it has been idle, over the cache
time it still needs until then. The lowest value goes first, children before
parents; a new block is admitted only if it is worth more than recent victims.

Between turns a hint re-classes the session's blocks, so a block waiting on a
fast tool is worth more than one waiting on a human, and per (workload, tool)
return times are learned from when sessions actually come back. With more than
one tier, a user turn whose expected gap is long moves the session's private
blocks one tier down (offload); a session end drops them; a victim is demoted
only if it may still come back and its next tier beats recompute under the
cost model.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator, Sequence

from kvstore.policies._prefix import ChildIndex
from kvstore.policies.base import BlockInfo, Hint, Move, Policy, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.returns import ReturnModel

__all__ = ["WorkloadPolicy"]

#: (workload, session's last turn event, partial block, short request, uses bucket,
#: shared by several sessions, share of the request's prefix seen before in quarters)
Cls = tuple[str, str, bool, bool, int, bool, int]


def _count_bucket(n: int) -> int:
    return 0 if n <= 1 else 1 if n == 2 else 2 if n <= 4 else 3 if n <= 8 else 4


class _Tier:
    __slots__ = ("by_cls", "capacity", "frontier", "hold_s", "index", "meta", "used")

    def __init__(self, hold_s: float, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        #: Running mean of the value of recent victims: the bar a newcomer must clear.
        self.frontier = 0.0
        self.by_cls: dict[Cls, OrderedDict[Hashable, None]] = {}
        self.meta: dict[Hashable, tuple[Cls, float, int]] = {}  # cls, last use, size
        self.index = ChildIndex()
        self.hold_s = hold_s


class WorkloadPolicy(Policy):
    name = "workload"

    def __init__(self, tiers: Sequence[TierSpec], cost: CostModel | None = None,
                 short_blocks: int = 8, keep_gap_s: float = 30.0, min_p_demote: float = 0.02,
                 history: int = 1 << 20, admit_margin: float = 1.0,
                 window_s: float | None = 150.0, density: bool = True,
                 use_shared: bool = True) -> None:
        super().__init__(tiers)
        self.cost = cost or CostModel()
        self.short_blocks = short_blocks
        self.keep_gap_s = keep_gap_s
        self.min_p_demote = min_p_demote
        self._history_max = history
        self.admit_margin = admit_margin
        self.window_s = window_s
        self.density = density
        self.use_shared = use_shared
        self.model = ReturnModel()
        #: Session return times after a hint, per (workload, event or tool).
        self.turns = ReturnModel()
        self._waiting: dict[str, tuple[tuple[str, str], float]] = {}
        self._t = {t.name: _Tier(60.0, t.capacity_bytes) for t in tiers}
        # key -> (class of its open lifetime, start time, uses, owner session, shared)
        self._hist: OrderedDict[Hashable, tuple[Cls, float, int, str, bool]] = OrderedDict()
        # session -> its last turn event ("" while a request runs), oldest first
        self._state: OrderedDict[str, str] = OrderedDict()
        self._seen: dict[str, int] = {}  # session -> seen-prefix quarters of its last request
        self._worth = {t.name: self.cost.worth_loading(t) for t in tiers}

    # -- classes and learning ---------------------------------------------------
    def _cls(self, info: BlockInfo, uses: int, shared: bool) -> Cls:
        partial = 0 < info.num_tokens < self.cost.block_tokens
        short = 0 < info.request_blocks < self.short_blocks
        return (info.workload, self._state.get(info.session_id, ""), partial, short,
                _count_bucket(uses), shared and self.use_shared,
                self._seen.get(info.session_id, 0))

    def _begin(self, key: Hashable, info: BlockInfo, now: float) -> Cls:
        """Close ``key``'s open lifetime (a return) and start a new one."""
        prev = self._hist.pop(key, None)
        uses, owner, shared = 1, info.session_id, False
        if prev is not None:
            self.model.returned(prev[0], now - prev[1])
            uses = prev[2] + 1
            owner = prev[3]
            shared = prev[4] or (owner != info.session_id and info.session_id != "")
        cls = self._cls(info, uses, shared)
        self.model.start(cls)
        self._hist[key] = (cls, now, uses, owner, shared)
        if len(self._hist) > self._history_max:
            self._hist.popitem(last=False)
        return cls

    def expected_gap(self, workload: str, event: str, tool: str | None = None) -> float | None:
        """Median learned return time of a session after ``event`` (None: not seen yet)."""
        state = f"tool:{tool or '?'}" if event == "tool_call" else event
        return self.turns.median_gap((workload, state))

    def value(self, cls: Cls, age: float, tier: str) -> float:
        window = self.window_s if self.window_s is not None else self._t[tier].hold_s
        if self.density:
            return self.model.density(cls, age, window)
        return self.model.p_return(cls, age, window)

    # -- engine callbacks -------------------------------------------------------
    def on_lookup(
        self, keys: Sequence[Hashable], hit_tiers: Sequence[str | None], info: BlockInfo,
        now: float,
    ) -> list[Move]:
        session = info.session_id
        waiting = self._waiting.pop(session, None)
        if waiting is not None:
            self.turns.returned(waiting[0], now - waiting[1])
        seen = 0
        for k in keys:
            if k not in self._hist:
                break
            seen += 1
        self._seen[session] = min(3, (4 * seen) // len(keys)) if keys else 0
        self._state.pop(session, None)
        self._state[session] = ""
        while len(self._state) > self._history_max:
            old, _ = self._state.popitem(last=False)
            self._waiting.pop(old, None)
            self._seen.pop(old, None)
        last = len(keys) - 1
        for j, k in enumerate(keys):
            tokens = info.num_tokens if j == last else self.cost.block_tokens
            binfo = BlockInfo(k, info.size, None, session, info.workload, tokens,
                              info.request_blocks)
            self._begin(k, binfo, now)
        for j, k in enumerate(keys):
            t = hit_tiers[j]
            if t is not None and k in self._t[t].meta:
                self._reclass(k, t, now)
        return []

    def _reclass(self, key: Hashable, tier: str, now: float) -> None:
        tr = self._t[tier]
        old = tr.meta.get(key)
        h = self._hist.get(key)
        if old is None or h is None:
            return
        del tr.by_cls[old[0]][key]
        tr.meta[key] = (h[0], now, old[2])
        tr.by_cls.setdefault(h[0], OrderedDict())[key] = None

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        tr = self._t[tier]
        if info.key in tr.meta:
            return
        h = self._hist.get(info.key)
        cls = h[0] if h is not None else self._begin(info.key, info, now)
        last = h[1] if h is not None else now
        tr.meta[info.key] = (cls, last, info.size)
        tr.used += info.size
        tr.by_cls.setdefault(cls, OrderedDict())[info.key] = None
        tr.index.add(info.key, info.parent, info.size)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        tr = self._t[tier]
        m = tr.meta.get(key)
        if m is None:
            return
        h = self._hist.get(key)
        cls = h[0] if h is not None else m[0]
        if cls != m[0]:
            del tr.by_cls[m[0]][key]
            tr.by_cls.setdefault(cls, OrderedDict())[key] = None
        else:
            tr.by_cls[cls].move_to_end(key)
        tr.meta[key] = (cls, now, m[2])

    def on_remove(self, key: Hashable, tier: str) -> None:
        tr = self._t[tier]
        m = tr.meta.pop(key, None)
        if m is None:
            return
        tr.used -= m[2]
        od = tr.by_cls[m[0]]
        del od[key]
        if not od:
            del tr.by_cls[m[0]]
        tr.index.remove(key)

    def evict(
        self, tier: str, nbytes: int, protected: Container[Hashable], now: float
    ) -> list[Hashable] | None:
        tr = self._t[tier]
        victims = tr.index.take(self._candidates(tr, tier, now), nbytes, protected)
        if victims:
            age = sum(now - tr.meta[v][1] for v in victims) / len(victims)
            tr.hold_s = 0.98 * tr.hold_s + 0.02 * max(age, 1.0)
            v = victims[0]
            val = self.value(tr.meta[v][0], now - tr.meta[v][1], tier)
            tr.frontier = 0.95 * tr.frontier + 0.05 * val
        return victims

    def _candidates(self, tr: _Tier, tier: str, now: float) -> Iterator[tuple[Hashable, int]]:
        """Blocks lowest value first: a merge of the per-class idle-time orders."""
        heap: list[tuple[float, int, Hashable, Iterator[Hashable], Cls]] = []
        meta = tr.meta
        for n, (cls, od) in enumerate(tr.by_cls.items()):
            it = iter(od)
            for key in it:
                heap.append((self.value(cls, now - meta[key][1], tier), n, key, it, cls))
                break
        heapq.heapify(heap)
        while heap:
            _, n, key, it, cls = heap[0]
            yield key, meta[key][2]
            for nxt in it:
                heapq.heapreplace(heap, (self.value(cls, now - meta[nxt][1], tier), n, nxt,
                                         it, cls))
                break
            else:
                heapq.heappop(heap)

    # -- placement ----------------------------------------------------------------
    def admit(self, info: BlockInfo, now: float) -> str | None:
        """The fastest tier (worth loading from) whose victims are worth less."""
        h = self._hist.get(info.key)
        cls = h[0] if h is not None else self._cls(info, 1, False)
        for t in self.tiers:
            if not self._worth[t.name]:
                continue
            tr = self._t[t.name]
            if tr.used + info.size <= tr.capacity:
                return t.name
            if self.value(cls, 0.0, t.name) > self.admit_margin * tr.frontier:
                return t.name
        return None

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        i = self._order[tier] + 1
        if i >= len(self.tiers):
            return None
        m = self._t[tier].meta.get(key)
        h = self._hist.get(key)
        if h is None:
            return None
        age = now - (m[1] if m is not None else h[1])
        nxt = self.tiers[i].name
        if not self._worth[nxt]:
            return None
        if self.model.p_return(h[0], age, 1e9) < self.min_p_demote:
            return None
        return nxt

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        session = hint.session_id
        state = hint.event
        if hint.event == "tool_call":
            state = f"tool:{hint.tool or '?'}"
        self._state[session] = state
        self._state.move_to_end(session)
        turn_cls = (hint.workload, state)
        if hint.event != "session_end":
            self.turns.start(turn_cls)
            self._waiting[session] = (turn_cls, now)
        else:
            self._waiting.pop(session, None)
        moves: list[Move] = []
        for key, tier in keys:
            h = self._hist.get(key)
            if h is None:
                continue
            self.model.unstart(h[0])
            old = h[0]
            cls: Cls = (old[0], state, old[2], old[3], old[4], old[5], old[6])
            self.model.start(cls)
            self._hist[key] = (cls, now, h[2], h[3], h[4])
            if key in self._t[tier].meta:
                self._reclass(key, tier, now)
            if h[4]:
                continue  # shared with other sessions: leave it to eviction
            if hint.event == "session_end":
                moves.append(Move(key, tier, None))
        if hint.event == "session_end" or len(self.tiers) < 2:
            return moves
        gap = hint.expected_gap_s
        if gap is None:
            gap = self.expected_gap(hint.workload, hint.event, hint.tool)
        if gap is not None and gap > self.keep_gap_s:
            top = self.tiers[0].name
            lower = next((t.name for t in self.tiers[1:] if self._worth[t.name]), None)
            if lower is not None:
                moves.extend(Move(k, top, lower) for k, t in keys
                             if t == top and not self._hist.get(k, (None,) * 5)[4])
        return moves
