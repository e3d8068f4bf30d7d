"""The workload-aware policy: keep the sessions that will be back soonest.

Chat and agents resend their whole history every call, so what is worth
caching is a *session's* prefix, and what decides its worth is when the session
sends again. A session's *value* (:mod:`~kvstore.policies.sessions`) is the share
of sessions of its class of wait (workload, what it waits on and which tool, how
many turns the session had so far, how fast it came back last time), having waited
as long as it has, that send again within the next ``window_s`` seconds, learned
online (:class:`~kvstore.policies.returns.ReturnTimes`); it never sees the future.
Blocks several sessions used belong to their workload's pool, valued by how soon
shared blocks come back (:mod:`~kvstore.policies.claims`).

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
  for the session's next request) is asked only where it pays
  (:mod:`~kvstore.policies.keeps`): every keep considered is judged when the
  session is back, held or not (:mod:`~kvstore.policies.holds`), and a class
  whose keeps gain less than half of what they pin asks none.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Container, Hashable, Iterator, Sequence
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
from kvstore.policies.claims import Claims
from kvstore.policies.cost import CostModel
from kvstore.policies.holds import HoldLedger, PendingHold
from kvstore.policies.keeps import Keeps
from kvstore.policies.returns import ReturnTimes
from kvstore.policies.sessions import _BACK, _IDLE, _WAIT, Sessions, _gap, _Session

__all__ = ["WorkloadPolicy"]


class WorkloadPolicy(Sessions, Claims, Keeps, Policy):
    """The sessions' values (:class:`~kvstore.policies.sessions.Sessions`), the blocks'
    owners (:class:`~kvstore.policies.claims.Claims`) and the HBM keep
    (:class:`~kvstore.policies.keeps.Keeps`), put together: admission, eviction,
    demotion and hints."""

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
        # Each key's use, recorded inline for the common case (its last user was this session, or
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
            room += tr.bytes_of(other)
            if room >= need:
                return need
        return max(room, 0)  # (a tier over its capacity gives nothing)

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
