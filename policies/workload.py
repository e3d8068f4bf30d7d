"""The workload-aware policy: keep what will be back soon, in the tier worth it.

Every block belongs to a *class* built from what the engine can see: workload,
the session's last turn event (tool call with its tool name, user turn,
session end), whether the block is partial (a request's last block, which the
next turn rewrites), the request's length (< 8, < 32 or more blocks), how often
the key was used, whether it is a head block (position 0-1: system prompts),
how much of the request's prefix was seen before, and how long ago the key was
last used. Per class the policy learns online when blocks come back
(:class:`~kvstore.policies.holdtime.HoldModel`); it never sees the future.

Each class gets a *hold time*: how long after a use a block is worth keeping
at the tier's price per block-second. Tiers are priced as a pool with the faster
tiers: a tier's price is the one at which the classes' demand fills it together
with the tiers above it, so the hierarchy as a whole holds a block as long as
its capacity makes worth while and the fast tier keeps the freshest part of
that. A block expires at its last use plus its hold
time; victims go in expiry order (expired ones first), children before
parents, and a parent never expires before a cached child (a prefix is only
worth its shortest-lived head). A request's missing blocks are admitted only
as a prefix of blocks worth a slot: a block with hold time 0 (a partial tail,
a class that does not come back soon enough) is refused, and so is everything
after it.

Between turns a hint re-classes the session's blocks, so a block waiting on a
fast tool is held as long as that tool's return calls for, and per (workload,
tool) return times are learned from when sessions actually come back. With
more than one tier, a user turn whose expected gap is long moves the session's
private blocks one tier down (offload); a session end drops them; a hint that
the session is about to send again (``tool_result``, ``user``,
``session_start``) prefetches its blocks in slower tiers into the fastest one
and ends the wait the previous hint started (the tool or user is back then).
A victim goes one tier down if that tier beats recompute under the cost model
and it has room, the victim's class comes back at all, its hold time there
still runs, or it would only displace a block there that expires sooner.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Sequence

from kvstore.policies._expiry import ExpiryLedger
from kvstore.policies.base import BlockInfo, Hint, Move, Policy, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.holdtime import HoldModel
from kvstore.policies.returns import ReturnModel

__all__ = ["Cls", "WorkloadPolicy"]

#: (workload, session's last turn event, partial block, request length bucket, uses
#: bucket, head block, share of the request's prefix seen before in quarters,
#: bucket of the time since the key's previous use)
Cls = tuple[str, str, bool, int, int, bool, int, int]

_GAPS = (60.0, 120.0, 240.0, 600.0)

#: Hints that say the session is about to send again (the tool returned, the user
#: is back, a session starts): its blocks in slower tiers are prefetched up.
_BACK = frozenset({"tool_result", "user", "session_start"})


def _gap_bucket(gap: float | None) -> int:
    if gap is None:
        return 0
    for i, edge in enumerate(_GAPS):
        if gap < edge:
            return i + 1
    return len(_GAPS) + 1


def _coarse(cls: Hashable) -> Hashable:
    """The parent class a sparse class borrows from: no prefix share, no gap."""
    return cls[:6] if isinstance(cls, tuple) else cls


class _Tier(ExpiryLedger):
    """A tier's blocks by expiry (``meta``: class, last use, size) and its price."""

    __slots__ = ("adj", "base", "lam")

    def __init__(self, capacity: int, lam: float) -> None:
        super().__init__(capacity)
        #: Price of a block-second in this tier: a base (solved from demand in the top
        #: tier) times a correction learned from evictions.
        self.base = lam
        self.adj = 1.0
        self.lam = lam


class WorkloadPolicy(Policy):
    name = "workload"

    def __init__(self, tiers: Sequence[TierSpec], cost: CostModel | None = None,
                 short_blocks: int = 8, long_blocks: int = 32, keep_gap_s: float = 30.0,
                 history: int = 1 << 20, lam0: float = 1e-3, solve_s: float = 20.0,
                 fill: float = 0.6, eta: float = 0.003, smoothing: float = 20.0,
                 adj_floor: float = 1.0, min_p_demote: float = 0.02) -> None:
        super().__init__(tiers)
        self.cost = cost or CostModel()
        self.short_blocks = short_blocks
        self.long_blocks = long_blocks
        self.keep_gap_s = keep_gap_s
        self._history_max = history
        self.solve_s = solve_s
        self.fill = fill
        self.eta = eta
        self.adj_floor = adj_floor
        self.min_p_demote = min_p_demote
        self.model = HoldModel(_coarse, smoothing=smoothing)
        #: Session return times after a hint, per (workload, event or tool).
        self.turns = ReturnModel()
        self._waiting: dict[str, tuple[tuple[str, str], float]] = {}
        self._t = {t.name: _Tier(t.capacity_bytes, lam0) for t in tiers}
        # key -> (class of its open lifetime, start time, uses, owner session, shared)
        self._hist: OrderedDict[Hashable, tuple[Cls, float, int, str, bool]] = OrderedDict()
        # session -> its last turn event ("" while a request runs), oldest first
        self._state: OrderedDict[str, str] = OrderedDict()
        self._seen: dict[str, int] = {}  # session -> seen-prefix quarters of its last request
        self._worth = {t.name: self.cost.worth_loading(t) for t in tiers}
        self._allow: dict[Hashable, str] = {}  # missing keys of the request -> tier
        self._first: float | None = None
        self._solved = 0.0
        self._block = self.cost.block_bytes

    # -- classes and learning ---------------------------------------------------
    def _cls(self, info: BlockInfo, uses: int, pos: int, gap: float | None) -> Cls:
        partial = 0 < info.num_tokens < self.cost.block_tokens
        n = info.request_blocks
        length = 0 if n < self.short_blocks else 1 if n < self.long_blocks else 2
        return (info.workload, self._state.get(info.session_id, ""), partial, length,
                min(uses - 1, 4), pos < 2, self._seen.get(info.session_id, 0),
                _gap_bucket(gap))

    def _begin(self, key: Hashable, info: BlockInfo, now: float, pos: int) -> Cls:
        """Close ``key``'s open lifetime (a return) and start a new one."""
        prev = self._hist.pop(key, None)
        uses, owner, shared, gap = 1, info.session_id, False, None
        if prev is not None:
            gap = now - prev[1]
            self.model.returned(prev[0], gap)
            uses = prev[2] + 1
            owner = prev[3]
            shared = prev[4] or (owner != info.session_id and info.session_id != "")
        cls = self._cls(info, uses, pos, gap)
        self.model.start(cls)
        self._hist[key] = (cls, now, uses, owner, shared)
        if len(self._hist) > self._history_max:
            self._hist.popitem(last=False)
        return cls

    def expected_gap(self, workload: str, event: str, tool: str | None = None) -> float | None:
        """Median learned return time of a session after ``event`` (None: not seen yet)."""
        state = f"tool:{tool or '?'}" if event == "tool_call" else event
        return self.turns.median_gap((workload, state))

    def hold(self, cls: Cls, tier: str, now: float) -> float:
        """Seconds a block of ``cls`` is worth keeping in ``tier`` after a use."""
        return self.model.hold(cls, self._t[tier].lam, now)

    def value(self, cls: Cls, age: float, tier: str, now: float = 0.0) -> float:
        """Hold time left for a block of ``cls`` idle ``age`` s (< 0: expired)."""
        return self.hold(cls, tier, now) - age

    def adopt(self, learned: WorkloadPolicy, span_s: float, start: float) -> None:
        """Start from ``learned``'s class statistics and prices, as if ``span_s``
        seconds had been seen before ``start`` (replay diagnostics only: see
        :mod:`kvstore.replay.ceiling`). Blocks, sessions and caches start empty."""
        self.model = learned.model
        self.model.invalidate()
        for name, tr in self._t.items():
            tr.base = tr.lam = learned._t[name].base
        self._first = start - span_s
        self._solved = start - self.solve_s

    # -- engine callbacks -------------------------------------------------------
    def on_lookup(
        self, keys: Sequence[Hashable], hit_tiers: Sequence[str | None], info: BlockInfo,
        now: float,
    ) -> list[Move]:
        self._tick(now, info.size)
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
        self._allow.clear()
        chain = True
        for j, k in enumerate(keys):
            tokens = info.num_tokens if j == last else self.cost.block_tokens
            binfo = BlockInfo(k, info.size, None, session, info.workload, tokens,
                              info.request_blocks)
            cls = self._begin(k, binfo, now, j)
            t = hit_tiers[j]
            if t is not None:
                if k in self._t[t]:
                    self._reclass(k, t, now)
                continue
            if chain:
                dst = self._place_for(cls, info.size, now)
                if dst is None:
                    chain = False
                else:
                    self._allow[k] = dst
        return []

    def _place_for(self, cls: Cls, size: int, now: float) -> str | None:
        """The fastest tier worth loading from that has room or holds ``cls`` a while."""
        for t in self.tiers:
            if not self._worth[t.name]:
                continue
            tr = self._t[t.name]
            if tr.used + size <= tr.capacity or self.hold(cls, t.name, now) > 0:
                return t.name
        return None

    def _tick(self, now: float, size: int) -> None:
        """Re-price the tiers. A tier worth loading from is priced as part of a pool
        with the faster tiers: its base price is the one at which the classes' demand
        fills ``fill`` of the pool's capacity (re-solved every ``solve_s``), so a
        block is held in the hierarchy as long as the whole of it makes worth while,
        and each faster tier keeps the part of that hold it can afford. Every tier's
        correction rises when it evicts a block still in its hold time and falls while
        it has room or expired blocks (never below ``adj_floor`` on a solved price)."""
        if size > 0:
            self._block = size
        if self._first is None:
            self._first = self._solved = now
        elapsed = now - self._first
        solve = (self.solve_s > 0 and elapsed > 3 * self.solve_s
                 and now - self._solved >= self.solve_s)
        pool = 0
        for t in self.tiers:
            tr = self._t[t.name]
            solved = self.solve_s > 0 and self._worth[t.name]
            if solved:
                pool += tr.capacity
                if solve:
                    blocks = self.fill * pool / self._block
                    tr.base = min(max(self.model.solve(tr.base, blocks, elapsed), 1e-6), 1.0)
            if tr.used + 4 * self._block <= tr.capacity or tr.earliest() <= now:
                # Room or expired blocks: cheaper. A solved price is only ever raised
                # (its demand already counts every class; the misses are overfills).
                tr.adj = max(tr.adj * (1.0 - self.eta), self.adj_floor if solved else 0.0)
            tr.lam = tr.base * tr.adj
        if solve:
            self._solved = now

    def _reclass(self, key: Hashable, tier: str, now: float) -> None:
        tr = self._t[tier]
        old = tr.meta.get(key)
        h = self._hist.get(key)
        if old is None or h is None:
            return
        tr.meta[key] = (h[0], now, old[2])
        tr.set_expiry(key, now + self.hold(h[0], tier, now))

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        tr = self._t[tier]
        if info.key in tr:
            return
        h = self._hist.get(info.key)
        cls = h[0] if h is not None else self._begin(info.key, info, now, 0)
        last = h[1] if h is not None else now
        tr.add(info.key, info.parent, (cls, last, info.size), last + self.hold(cls, tier, now))

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        tr = self._t[tier]
        m = tr.meta.get(key)
        if m is None:
            return
        h = self._hist.get(key)
        cls = h[0] if h is not None else m[0]
        tr.meta[key] = (cls, now, m[2])
        tr.set_expiry(key, now + self.hold(cls, tier, now))

    def on_remove(self, key: Hashable, tier: str) -> None:
        self._t[tier].remove(key)

    def evict(
        self, tier: str, nbytes: int, protected: Container[Hashable], now: float
    ) -> list[Hashable] | None:
        tr = self._t[tier]
        victims = tr.take(nbytes, protected)
        if victims and tr.expiry(victims[0], now) > now:
            # evicting blocks still in their hold time: a block-second is dearer
            tr.adj *= 1.0 + self.eta
            tr.lam = tr.base * tr.adj
        return victims

    # -- placement ----------------------------------------------------------------
    def admit(self, info: BlockInfo, now: float) -> str | None:
        """The tier chosen when the request was looked up (a prefix worth a slot)."""
        dst = self._allow.get(info.key)
        if dst is not None:
            return dst
        if info.key in self._hist:
            return None
        return self._place_for(self._cls(info, 1, 0, None), info.size, now)

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        """The next tier, if it has room, the victim's class comes back at all
        (``min_p_demote`` of its lifetimes), its hold there still runs, or it would
        only displace a block there that expires sooner; ``None`` past the last tier
        or into a tier that loses to recompute."""
        i = self._order[tier] + 1
        if i >= len(self.tiers):
            return None
        nxt = self.tiers[i].name
        h = self._hist.get(key)
        if h is None or not self._worth[nxt]:
            return None
        started, back = self.model.observations(h[0])
        if back >= self.min_p_demote * max(started, 1):
            return nxt
        nt = self._t[nxt]
        if nt.used + self._block <= nt.capacity:
            return nxt  # room costs nothing
        expiry = h[1] + self.hold(h[0], nxt, now)
        return nxt if expiry > now or nt.earliest() < expiry else None

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        session = hint.session_id
        state = hint.event
        if hint.event == "tool_call":
            state = f"tool:{hint.tool or '?'}"
        self._state[session] = state
        self._state.move_to_end(session)
        turn_cls = (hint.workload, state)
        if hint.event in _BACK:
            waited = self._waiting.pop(session, None)
            if waited is not None:  # the wait the last hint started is over
                self.turns.returned(waited[0], now - waited[1])
        if hint.event != "session_end":
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
            cls: Cls = (old[0], state, *old[2:])
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
        top = self.tiers[0].name
        if hint.event in _BACK:
            return [Move(k, t, top) for k, t in keys if t != top]
        gap = hint.expected_gap_s
        if gap is None:
            gap = self.expected_gap(hint.workload, hint.event, hint.tool)
        if gap is not None and gap > self.keep_gap_s:
            lower = next((t.name for t in self.tiers[1:] if self._worth[t.name]), None)
            if lower is not None:
                moves.extend(Move(k, top, lower) for k, t in keys
                             if t == top and not self._hist.get(k, (None,) * 5)[4])
        return moves
