"""The workload-aware policy: keep the sessions that will be back soonest.

Chat and agents resend their whole history every call, so what is worth
caching is a *session's* prefix, and what decides its worth is when the session
sends again. Every session is waiting on something: a tool it called, its
user, nothing any more (it ended), or, without hints, just waiting. Per class
of wait (workload, what it waits on and which tool, how many turns the session
had so far, how fast it came back last time) the policy learns online when
sessions come back
(:class:`~kvstore.policies.returns.ReturnTimes`); it never sees the future.

A session's *value* is the share of sessions of its class, having waited as
long as it has, that send again within the next ``window_s`` seconds: a
session waiting on a quick tool is worth a lot, one whose user has been away
for ten minutes little, an ended one nothing. A session with a request in
flight is valued by the wait its lookup announced (``then`` / ``tool``: what
that wait is worth at its start), else by what usually follows a request of its
workload (a tool call, a user turn, nothing).

* Eviction takes the least valuable session first, its chain's tail first
  (children before parents, so a prefix shrinks from its end).
* Admission compares: a request's missing blocks enter a tier if it has room,
  or if the sessions they would push out are worth less than the newcomer by
  ``margin``; otherwise they bypass it (the incumbent keeps its place, which is
  what stops two sessions from evicting each other turn after turn). A
  request's last block, when partial, is never stored: the next turn rewrites
  it.
* With more than one tier, a block a tier lets go (and a new block's
  write-back copy) goes one tier down if that tier would admit it by the same
  rule, and only into tiers that beat recompute under the cost model.
* Hints re-class a session at once. After ``session_end`` its blocks are worth
  nothing: the first to go when room is needed, not dropped at once (a RAG
  document or a batch template an ended session used is often the next
  session's prefix); a hint that the session is about to send (``tool_result``,
  ``user``, ``session_start``)
  prefetches its blocks into the fastest tier; a wait whose expected gap (the
  hint's, else the class's median) is longer than ``keep_gap_s`` moves its
  blocks out of the fastest tier.
* The HBM keep (``Plan.keep_s``: the engine holds a finished request's blocks
  for the session's next request) is asked only where it pays: every keep
  considered (a tool call or user turn whose class is back soon) is judged when
  the session is back, held or not (:mod:`~kvstore.policies.holds`): was it back
  within the keep, for the prefix held, and would the sidecar not have served
  that prefix nearly as fast itself? A class whose keeps gain less than half of
  what they pin asks none. Before a class is judged, a keep is asked for the gap
  the client gave, or where the sidecar will not hold the request's prefix in a
  fast tier. Where the lookup says what the engine's own cache held
  (``RequestInfo.engine_hit``), what it kept by itself gains nothing, asked keeps
  go unjudged and one in four is left unasked to keep judging (the ledger's probe).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Container, Hashable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter, sub
from typing import Any, Self

from kvstore.policies._owners import Pool, TierOwners
from kvstore.policies.base import (
    BlockInfo,
    Hint,
    Move,
    Plan,
    Policy,
    PolicyConfig,
    RequestInfo,
    TierSpec,
)
from kvstore.policies.cost import CostModel
from kvstore.policies.holds import HoldLedger, PendingHold
from kvstore.policies.returns import ReturnTimes

_FIRST, _SECOND = itemgetter(0), itemgetter(1)

__all__ = ["WorkloadPolicy"]

#: Hint event -> what the session waits on after it.
_WAIT = {"tool_call": "tool", "turn_end": "user", "session_end": "end",
         "tool_result": "back", "user": "back", "session_start": "back"}
#: Hints that say the session is about to send again: its blocks are prefetched up.
_BACK = frozenset({"tool_result", "user", "session_start"})
#: What a request's session waits on when no hint follows it.
_IDLE = "idle"
_MAX_TOOLS = 32
#: Waits of a class seen before its statistics may decide an HBM keep.
_KEEP_MIN_WAITS = 8


def _turns(n: int) -> int:
    """Bucket of how many requests the session made: 1, 2-3, 4+."""
    return 0 if n <= 1 else 1 if n <= 3 else 2


def _gap(gap: float | None) -> int:
    """Bucket of how long the session took to come back last time."""
    return 0 if gap is None else 1 if gap < 60 else 2 if gap < 240 else 3




@dataclass(slots=True)
class _Session:
    workload: str
    wait: str = _IDLE  # idle | tool | user | end | back
    tool: str = ""
    since: float = 0.0
    turns: int = 0
    last_gap: int = 0  # bucket of its last return gap
    cls: tuple[str, str, str, int, int] = ("", _IDLE, "", 0, 0)
    #: the wait counts toward learning (a real wait, not one a hint replaced at once)
    learning: bool = False
    gap: float | None = None  # a hint's expected gap, when the client gave one
    #: the keep considered for its last request, judged when it is back
    hold: PendingHold | None = None
    #: its last request's full blocks and the key of the last of them
    full: tuple[int, Hashable] | None = None
    #: its last lookup said what the turn ends with (the keep was considered there)
    told: bool = False
    #: what it will wait on (and the tool) once its request in flight ends, if said
    next: tuple[str, str] | None = None


class WorkloadPolicy(Policy):
    name = "workload"

    def __init__(self, tiers: Sequence[TierSpec], cost: CostModel | None = None,
                 window_s: float = 60.0, margin: float = 1.5, keep_gap_s: float = 30.0,
                 max_sessions: int = 200_000, hbm_keep_max_s: float = 10.0,
                 hold_bar: float = 0.5) -> None:
        super().__init__(tiers)
        self.hbm_keep_max_s = hbm_keep_max_s
        self.cost = cost or CostModel()
        block_s = self.cost.recompute_s(self.cost.block_tokens)
        #: whether the keeps of each class paid (judged at every return)
        self.holds = HoldLedger({t.name: 1.0 - min(1.0, self.cost.saved_s(t) / block_s)
                                 for t in tiers}, hold_bar, max_running=max_sessions)
        self.window_s = window_s
        self._vcache: dict[tuple[Hashable, int], float] = {}
        #: bumped on entering and leaving on_request and on_hint (what changes a
        #: session's value happens there): a session's value is a pure function of
        #: ``now`` and this epoch, so it is computed once per pair (``_memo``); and a
        #: tier's order of owners once per pair, its owners and its pools' values
        #: (``_orders``, per tier and skipped owner)
        self._epoch = 0
        self._memo: dict[Hashable, float] = {}
        self._memo_at: tuple[float, int] | None = None
        self._orders: dict[tuple[str, Hashable], tuple[tuple[Any, ...],
                                                       list[tuple[float, Hashable]]]] = {}
        self.margin = margin
        self.keep_gap_s = keep_gap_s
        self.max_sessions = max_sessions
        self.returns = ReturnTimes()
        #: workload -> what its requests were followed by (the next wait)
        self.follows: dict[str, Counter[str]] = {}
        self._sessions: OrderedDict[Hashable, _Session] = OrderedDict()
        self._t = {t.name: TierOwners(t.capacity_bytes) for t in tiers}
        self._worth: tuple[bool, ...] = tuple(
            self.cost.worth_loading(t) for t in tiers)
        self._tools: dict[str, set[str]] = {}
        self._now = 0.0
        #: key -> (session that used it last, when; None once shared), two generations
        self._uses: dict[Hashable, tuple[Hashable | None, float]] = {}
        self._pools: dict[str, Pool] = {}
        self._old_uses: dict[Hashable, tuple[Hashable | None, float]] = {}

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        """Takes the engine's cost model and its HBM keep limit (when given)."""
        if config.cost is not None:
            options["cost"] = config.cost
        if config.hbm_keep_max_s is not None:
            options["hbm_keep_max_s"] = config.hbm_keep_max_s
        return cls(config.tiers, **options)

    # -- sessions and their value -------------------------------------------------------
    def _session(self, name: Hashable, workload: str) -> _Session:
        s = self._sessions.get(name)
        if s is None:
            s = self._sessions[name] = _Session(workload)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(name)
        return s

    def _tool(self, workload: str, tool: str | None) -> str:
        """Tool names are client strings: at most ``_MAX_TOOLS`` become classes."""
        if not tool:
            return "?"
        known = self._tools.setdefault(workload, set())
        if tool in known or len(known) < _MAX_TOOLS:
            known.add(tool)
            return tool
        return "other"

    def _wait(self, name: Hashable, s: _Session, wait: str, tool: str, now: float,
              gap: float | None = None) -> None:
        """``name`` starts waiting on ``wait`` now."""
        if s.learning and s.wait == _IDLE and wait != _IDLE:
            self.returns.cancel(s.cls)  # a hint says what this wait really is
        s.wait, s.tool, s.since, s.gap = wait, tool, now, gap
        s.cls = self._cls(s, wait, tool)
        s.learning = wait not in ("end", "back")
        if s.learning:
            self.returns.start(s.cls)

    @staticmethod
    def _cls(s: _Session, wait: str, tool: str) -> tuple[str, str, str, int, int]:
        return (s.workload, wait, tool, _turns(s.turns), s.last_gap)

    def _value(self, name: Hashable) -> float:
        return self._value_at(name, self._now)

    def _value_at(self, name: Hashable, now: float) -> float:
        if isinstance(name, Pool):
            return self._pool_value(name, now)
        at = (now, self._epoch)
        if at != self._memo_at:
            self._memo.clear()
            self._memo_at = at
        v = self._memo.get(name)
        if v is None:
            # (computed again at the same ``now`` and epoch it hits ``_vcache`` only:
            # the same value, and nothing changes, so it is not computed again)
            s = self._sessions.get(name)
            v = self._memo[name] = 0.0 if s is None else self._value_of(s, now)
        return v

    def _worst_first(self, tier: str, now: float, skip: Hashable | None = None
                     ) -> list[tuple[float, Hashable]]:
        """``TierOwners.worst_first`` of the tier valued at ``now``, sorted again only
        when ``now``, the epoch, the owners there or a pool's value changed. A pool's
        value (what its oldest block is worth) changes with its blocks, so it is
        computed at every call, as every value was before; a session's is the memo's
        then, the same value computed again."""
        tr = self._t[tier]
        pools = tuple([self._pool_value(p, now) for p in tr.pools if p != skip])
        stamp = (now, self._epoch, tr.groups, pools)
        key = (tier, skip)
        cached = self._orders.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        order = tr.worst_first(lambda owner: self._value_at(owner, now), skip)
        if len(self._orders) >= 64:  # (one entry per skipped session: keep it small)
            self._orders.clear()
        self._orders[key] = (stamp, order)
        return order

    def _pool_value(self, pool: Pool, now: float) -> float:
        """A pool is worth what its least recently used block is: shared blocks of the
        workload, idle that long, come back within the window that often."""
        for tr in self._t.values():
            key = tr.oldest(pool)
            if key is not None:
                use = self._uses.get(key) or self._old_uses.get(key)
                age = now - use[1] if use is not None else 1e9
                return self._score((pool.workload, "shared", "", 0, 0), age)
        return 0.0

    def _pool(self, workload: str) -> Pool:
        """The one :class:`Pool` object of ``workload`` (owners compare by identity
        first, a block's claim being the hot path of every lookup)."""
        pool = self._pools.get(workload)
        if pool is None:
            pool = self._pools[workload] = Pool(workload)
        return pool

    def _use(self, key: Hashable, name: Hashable, workload: str, now: float) -> bool:
        """Record that ``name`` used ``key``; True if the key is shared (two sessions used
        it). A shared key's reuse gaps are learned as the workload's "shared" wait."""
        prev = self._uses.get(key)
        if prev is None:
            prev = self._old_uses.get(key)
        shared = prev is not None and prev[0] != name
        if shared:
            cls = (workload, "shared", "", 0, 0)
            if prev is not None and prev[0] is None:
                self.returns.returned(cls, now - prev[1])
            self.returns.start(cls)
            self._uses[key] = (None, now)
        else:
            self._uses[key] = (name, now)
        if len(self._uses) > self.max_sessions * 10:
            self._old_uses, self._uses = self._uses, {}
        return shared

    def _value_of(self, s: _Session, now: float) -> float:
        if s.wait == "end":
            return 0.0
        if s.wait == "back":
            return 1.0 + 1e-3
        if s.wait == _IDLE and s.next is not None:  # in flight, its next wait said
            return self._newcomer(s)
        e = max(0.0, now - s.since)
        if s.gap is not None:  # the client said when it will be back
            left = s.gap - e
            return 1.0 if 0.0 <= left <= self.window_s else (
                self.window_s / left if left > 0 else 0.05)
        return self._score(s.cls, e)

    def _score(self, cls: Hashable, e: float) -> float:
        q = int(e) if e < 60 else 60 + int(e - 60) // 10 if e < 660 else 120 + int(e) // 60
        key = (cls, q)
        v = self._vcache.get(key)
        if v is None:
            v = self._vcache[key] = self.returns.rate(cls, e, self.window_s)
        return v

    def _newcomer(self, s: _Session) -> float:
        """Value of a session whose request is in flight: what its next wait is worth
        at its start: the wait its lookup said (``then``), else weighed by what usually
        follows a request of its workload."""
        if s.next is not None:
            wait, tool = s.next
            return 0.0 if wait == "end" else self._score(self._cls(s, wait, tool), 0.0)
        follows = self.follows.get(s.workload)
        if not follows:
            return self._score(self._cls(s, _IDLE, ""), 0.0)
        total = sum(follows.values())
        return sum(n / total * (0.0 if w == "end" else
                                self._score(self._cls(s, w, "?" if w == "tool" else ""), 0.0))
                   for w, n in follows.items())

    # -- requests -----------------------------------------------------------------------
    def on_request(self, req: RequestInfo, now: float) -> Plan:
        self._epoch += 1
        try:
            return self._on_request(req, now)
        finally:
            self._epoch += 1

    def _on_request(self, req: RequestInfo, now: float) -> Plan:
        self._now = now
        self._vcache.clear()
        if req.worth:
            self._worth = tuple(req.worth)
        name = req.session_id
        self._expire_holds(now)
        s = self._session(name, req.workload)
        if s.hold is not None:
            self._judge_hold(s, req, now)
        if s.turns:
            if s.learning:
                self.returns.returned(s.cls, now - s.since)
                s.last_gap = _gap(now - s.since)
            if s.wait == _IDLE:
                self.follows.setdefault(s.workload, Counter())[_IDLE] += 1
        s.turns += 1
        self._wait(name, s, _IDLE, "", now)
        then = _WAIT.get(req.then)
        s.next = ((then, self._tool(s.workload, req.tool) if then == "tool" else "")
                  if then in ("tool", "user", "end") else None)
        keys, hit = req.keys, req.hit_tiers
        pool = self._pool(req.workload)
        # _use inlined for the common case (the key's last user was this session, or
        # none): a lookup walks every block of a long prefix here.
        trs, wl, limit = self._t, req.workload, self.max_sessions * 10
        uses, old_uses = self._uses, self._old_uses
        mine, pooled = (name, now), (None, now)
        #: a shared key's reuse gaps (learned as the workload's "shared" wait, counted
        #: once for the request: nothing reads the counts in between)
        gaps: list[float] = []
        starts = 0
        claims: dict[str, list[tuple[Hashable, Hashable, int]]] = {}
        prevs = list(map(uses.get, keys))  # (read by both runs: neither writes if it fails)
        if self._claim_run(keys, hit, name, mine, prevs):
            pass  # (the session's own prefix back: done in C-level passes)
        elif (run := self._pooled_run(keys, hit, name, pool, pooled, prevs)) is not None:
            gaps, starts = run, len(run)  # (a prefix of the pool's: C-level passes too)
        else:
            for j, (k, t) in enumerate(zip(keys, hit, strict=True)):
                prev = uses.get(k)
                if prev is None:
                    prev = old_uses.get(k)
                shared = prev is not None and prev[0] != name
                if shared:
                    if prev is not None and prev[0] is None:
                        gaps.append(now - prev[1])
                    starts += 1
                uses[k] = pooled if shared else mine
                if len(uses) > limit:
                    self._old_uses, self._uses = uses, {}
                    uses, old_uses = self._uses, self._old_uses
                if t is not None:
                    of_tier = claims.get(t)
                    if of_tier is None:
                        of_tier = claims[t] = []
                    of_tier.append((k, pool if shared else name, j))
        for t, todo in claims.items():
            trs[t].claim_many(todo)
        if starts:
            cls = (wl, "shared", "", 0, 0)
            self.returns.returned_many(cls, gaps)
            self.returns.start(cls, starts)
        missing = [j for j, t in enumerate(hit) if t is None] if None in hit else []
        if missing and missing[-1] == len(keys) - 1 and 0 < req.last_tokens < req.block_tokens:
            missing.pop()  # a partial last block: the next turn rewrites it
        admit: dict[Hashable, str] = {}
        if missing and not req.block_bytes:  # sizes unknown yet: the fastest worthy tier
            top = next((t.name for i, t in enumerate(self.tiers) if self._worth[i]), None)
            admit = {keys[j]: top for j in missing} if top else {}
            return Plan(admit, keep_s=self._keep_s(s, req, admit))
        if missing:
            value = self._newcomer(s)
            size = req.block_bytes
            left = len(missing)
            it = iter(missing)
            for i, spec in enumerate(self.tiers):
                if not self._worth[i] or not left:
                    continue
                n = min(left, self._room(spec.name, value, size * left, name) // max(size, 1))
                for _ in range(n):
                    admit[keys[next(it)]] = spec.name
                left -= n
        return Plan(admit, keep_s=self._keep_s(s, req, admit))

    def _claim_run(self, keys: Sequence[Hashable], hit: Sequence[str | None],
                   name: Hashable, mine: tuple[Hashable, float],
                   prevs: list[tuple[Hashable, float] | None]) -> bool:
        """:meth:`on_request`'s walk over the keys in C-level passes, for the common
        case only (False: nothing done): the session's prefix back (each key last used
        by this session, none shared), then keys never seen, the hits a prefix of
        them in one tier. The same uses, claims and positions as the walk. ``prevs``:
        each key's use (``self._uses.get``)."""
        n = len(keys)
        if not n or len(hit) != n:
            return False
        uses = self._uses
        fresh = prevs.count(None)
        m = n - fresh  # keys known, a prefix
        if m:
            p0 = prevs[0]
            if p0 is None or p0[0] != name or prevs.count(p0) != m:
                return False
        if len(uses) + fresh > self.max_sessions * 10:
            return False  # (the walk would turn a generation over)
        if fresh:
            if prevs.index(None) != m:
                return False
            if list(map(self._old_uses.get, keys[m:])).count(None) != fresh:
                return False
        nh = n - hit.count(None)  # hits, a prefix in one tier
        if nh and (hit[0] is None or hit.count(hit[0]) != nh
                   or (nh < n and hit.index(None) != nh)):
            return False
        uses.update(zip(keys, repeat(mine)))
        if nh:
            t0 = hit[0]
            assert t0 is not None
            self._t[t0].claim_run(keys[:nh] if nh < n else keys, name)
        return True

    def _pooled_run(self, keys: Sequence[Hashable], hit: Sequence[str | None],
                    name: Hashable, pool: Pool, pooled: tuple[None, float],
                    prevs: list[Any]) -> list[float] | None:
        """:meth:`on_request`'s walk in C-level passes for its other common case (None:
        nothing done): every key distinct and last used by the workload's pool (a
        prefix shared between sessions, as a system prompt is), the hits a prefix of
        them in one tier. The same uses and claims as the walk; returns the keys'
        reuse gaps (each key a shared start). ``prevs``: each key's use."""
        n = len(keys)
        if not n or len(hit) != n or name is None:
            return None
        uses = self._uses
        if None in prevs or list(map(_FIRST, prevs)).count(None) != n:
            return None
        if len(uses) > self.max_sessions * 10:
            return None
        # key -> chain position (and: are they distinct?)
        at = dict(zip(keys, range(n), strict=True))
        if len(at) != n:
            return None
        nh = n - hit.count(None)  # hits, a prefix in one tier
        if nh and (hit[0] is None or hit.count(hit[0]) != nh
                   or (nh < n and hit.index(None) != nh)):
            return None
        uses.update(dict.fromkeys(at, pooled))  # (the hashes known: no second hashing)
        if nh:
            t0 = hit[0]
            assert t0 is not None
            self._t[t0].claim_run(keys[:nh] if nh < n else keys, pool,
                                  at if nh == n else None)
        return list(map(sub, repeat(pooled[1]), map(_SECOND, prevs)))

    # -- the HBM keep -------------------------------------------------------------------
    @staticmethod
    def _full(req: RequestInfo) -> int:
        """Full blocks of the request (what the engine caches and a keep holds)."""
        n = len(req.keys)
        return n - 1 if n and 0 < req.last_tokens < req.block_tokens else n

    def _expire_holds(self, now: float) -> None:
        """Keeps whose session was not back by their end gained nothing."""
        for name, h in self.holds.expired(now):
            cls = h.cls
            s = self._sessions.get(name)
            if s is not None and s.hold is h:
                s.hold = None
                self.holds.judge(cls, 0.0)

    def _judge_hold(self, s: _Session, req: RequestInfo, now: float) -> None:
        """The session is back: would the keep considered for its last request have
        paid (:meth:`HoldLedger.returned`)?"""
        h = s.hold
        s.hold = None
        if h is None:
            return
        worth = req.worth or self._worth
        tiers = [t if t is not None and worth[self._order[t]] else None
                 for t in req.hit_tiers[:h.blocks]]
        self.holds.returned(h, req.keys, tiers, now - s.since, req.engine_hit)

    def _keep_s(self, s: _Session, req: RequestInfo, admit: dict[Hashable, str]) -> float:
        """The keep the wait's class would get (:meth:`_keep_for`), asked only where
        it pays: once the class's past keeps are judged (:class:`HoldLedger`), if they
        won at least the ledger's ``bar`` of what they held; before that, for the gap
        the client gave, or if the sidecar will not hold this request's prefix in a
        tier nearly as fast as the engine (refused, or in a slow tier), so that a
        return would recompute or slowly load most of it. Every keep considered is
        judged when the session is back, asked or not."""
        s.hold = None
        n = self._full(req)
        s.full = (n, req.keys[n - 1]) if n > 0 else None
        s.told = bool(req.then)
        wait = _WAIT.get(req.then)
        tool = self._tool(s.workload, req.tool) if wait == "tool" else ""
        keep = self._keep_for(s, wait, tool, req.expected_gap_s)
        if keep <= 0.0 or n <= 0:
            return 0.0
        cls = (s.workload, wait, tool)
        s.hold = PendingHold(cls, keep, n, req.keys[n - 1])
        pays = self.holds.pays(cls)
        if pays is None and req.expected_gap_s is None:
            plan = [t if t is not None else admit.get(k)
                    for k, t in zip(req.keys[:n], req.hit_tiers[:n], strict=True)]
            pays = self.holds.gain_over(plan, n) >= self.holds.bar
        if not (pays or pays is None):
            return 0.0
        if req.engine_hit is not None and not self.holds.ask(cls):
            return 0.0  # a probe: unasked, its return shows what the engine keeps itself
        s.hold = PendingHold(cls, keep, n, req.keys[n - 1], asked=True)
        return keep

    def _keep_for(self, s: _Session, wait: str | None, tool: str, gap: float | None,
                  keep: bool = True) -> float:
        """The keep considered (asked only where it pays, :meth:`_keep_s`): how long the
        engine would hold this request's blocks after it ends. Only for a turn that ends
        waiting (on a tool or the user): for the gap the client gave, if it is at most
        ``hbm_keep_max_s``; else if most sessions of the wait's
        class (learned per tool, as for eviction) were back within ``hbm_keep_max_s``,
        until nine in ten of those are. Before a class has ``_KEEP_MIN_WAITS`` waits of
        its own, the hint decides: a tool call is considered for the whole bound (tools
        answer in seconds), a user turn is not (people answer in minutes). Otherwise 0:
        release (offload what was saved)."""
        limit = self.hbm_keep_max_s
        if limit <= 0 or wait not in ("tool", "user"):
            return 0.0
        if gap is not None:
            return gap if 0.0 < gap <= limit else 0.0
        cls = self._cls(s, wait, tool)
        if self.returns.waits(cls) < _KEEP_MIN_WAITS:
            return limit if wait == "tool" else 0.0
        back = self.returns.back_by(cls, limit, keep)
        if back < 0.5:
            return 0.0
        t = limit / 64
        while t < limit and self.returns.back_by(cls, t, keep) < 0.9 * back:
            t *= 2
        return min(t, limit)

    def _room(self, tier: str, value: float, need: int, session: Hashable) -> int:
        """Bytes ``tier`` can give a newcomer worth ``value``: free room plus what
        sessions worth less than ``value / margin``, or nothing at all, hold (up to
        ``need``)."""
        tr = self._t[tier]
        room = tr.capacity - tr.used
        if room >= need:
            return need
        bar = value / self.margin
        for v, other in self._worst_first(tier, self._now, session):
            if v >= bar and v > 0.0:  # what is worth nothing goes for anyone
                break
            room += sum(tr.sizes[k] for k in tr.blocks_of(other))
            if room >= need:
                return need
        return room

    # -- hints --------------------------------------------------------------------------
    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        self._epoch += 1
        try:
            return self._on_hint(hint, keys, now)
        finally:
            self._epoch += 1

    def _on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float
                 ) -> list[Move]:
        self._now = now
        name = hint.session_id
        s = self._session(name, hint.workload)
        wait = _WAIT.get(hint.event, _IDLE)
        if hint.event in _BACK and s.learning:
            self.returns.returned(s.cls, now - s.since)  # the wait is over now
            s.learning = False
        if s.wait == _IDLE and s.turns and wait != "back":
            self.follows.setdefault(s.workload, Counter())[wait] += 1
        tool = self._tool(s.workload, hint.tool) if wait == "tool" else ""
        self._wait(name, s, wait, tool, now, hint.expected_gap_s)
        s.next = None
        if wait in ("tool", "user"):
            if not s.told and s.full is not None:  # no ``then`` at its lookup
                keep = self._keep_for(s, wait, tool, hint.expected_gap_s, keep=False)
                if keep > 0.0:
                    s.hold = PendingHold((s.workload, wait, tool), keep, *s.full)
            if s.hold is not None:
                self.holds.watch(name, s.hold, now)
        elif wait == "end" and s.hold is not None:  # it will not be back: gained nothing
            self.holds.judge(s.hold.cls, 0.0)
            s.hold = None
        if hint.event == "session_end" or len(self.tiers) < 2:
            return []  # an ended session is worth nothing: its blocks are the first to go
        top = self.tiers[0].name
        if hint.event in _BACK:
            return [Move(k, t, top) for k, t in keys if t != top]
        gap = hint.expected_gap_s
        if gap is None and wait in ("user", "tool"):
            gap = self.returns.median(s.cls)
        if wait in ("user", "tool") and gap is not None and gap > self.keep_gap_s:
            lower = next((t.name for i, t in enumerate(self.tiers) if i and self._worth[i]),
                         None)
            if lower is not None:
                return [Move(k, top, lower) for k, t in keys if t == top]
        return []

    # -- bookkeeping and eviction -----------------------------------------------------------
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        tr = self._t[tier]
        if info.key in tr:
            return
        name = info.session_id
        use = self._uses.get(info.key)
        if use is not None and use[0] is None:
            name = self._pool(info.workload)
        pos = 0
        for other in self._t.values():  # a copy keeps its chain position and owner
            p = other.pos.get(info.key)
            if p is not None:
                pos = p
                name = other.owner.get(info.key, name)
                break
        tr.add(info.key, info.size, name, pos)

    def on_insert_many(self, infos: Sequence[BlockInfo], tier: str, now: float) -> None:
        if type(self).on_insert is not WorkloadPolicy.on_insert:  # a subclass's own
            super().on_insert_many(infos, tier, now)
            return
        tr = self._t[tier]
        others = list(self._t.values())
        uses = self._uses
        for info in infos:
            key = info.key
            if key in tr:
                continue
            name = info.session_id
            use = uses.get(key)
            if use is not None and use[0] is None:
                name = self._pool(info.workload)
            pos = 0
            for other in others:  # a copy keeps its chain position and owner
                p = other.pos.get(key)
                if p is not None:
                    pos = p
                    name = other.owner.get(key, name)
                    break
            tr.add(key, info.size, name, pos)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        self._now = now

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        self._now = now

    def on_remove(self, key: Hashable, tier: str) -> None:
        self._t[tier].remove(key)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterator[Hashable]:
        """Least valuable session (valued at ``now``) first, its chain's tail first."""
        return self._t[tier].victims(lambda: self._worst_first(tier, now))

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        """The next tier, if it beats recompute and would admit the block's session."""
        self._now = now
        i = self._order[tier] + 1
        if i >= len(self.tiers) or not self._worth[i]:
            return None
        nxt = self.tiers[i].name
        owner = self._t[tier].owner.get(key)
        value = self._value(owner) if owner is not None else 0.0
        if value <= 0.0:
            return None
        size = self._t[tier].sizes.get(key, 1)
        return nxt if self._room(nxt, value, size, owner or "") >= size else None
