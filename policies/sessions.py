"""A workload policy's sessions: what each waits on, and what its blocks are worth.

Part of :class:`~kvstore.policies.workload.WorkloadPolicy` (its valuation half).
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
workload (a tool call, a user turn, nothing). A tier's owners (sessions and the
workloads' pools of shared blocks, :mod:`~kvstore.policies.claims`) are ordered
least valuable first, for eviction and admission alike.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvstore.policies._owners import Pool
from kvstore.policies.holds import PendingHold

if TYPE_CHECKING:
    from kvstore.policies._owners import TierOwners
    from kvstore.policies.returns import ReturnTimes

__all__ = ["Sessions"]

#: Hint event -> what the session waits on after it.
_WAIT = {"tool_call": "tool", "turn_end": "user", "session_end": "end",
         "tool_result": "back", "user": "back", "session_start": "back"}
#: Hints that say the session is about to send again: its blocks are prefetched up.
_BACK = frozenset({"tool_result", "user", "session_start"})
#: What a request's session waits on when no hint follows it.
_IDLE = "idle"
_MAX_TOOLS = 32


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


class Sessions:
    """The sessions and their value, a part of
    :class:`~kvstore.policies.workload.WorkloadPolicy`."""

    if TYPE_CHECKING:
        # What this part reads of the policy (set in WorkloadPolicy.__init__).
        window_s: float
        max_sessions: int
        returns: ReturnTimes
        follows: dict[str, Counter[str]]
        _sessions: OrderedDict[Hashable, _Session]
        _t: dict[str, TierOwners]
        _tools: dict[str, set[str]]
        _now: float
        _vcache: dict[tuple[Hashable, int], float]
        _epoch: int
        _memo: dict[Hashable, float]
        _memo_at: tuple[float, int] | None
        _orders: dict[tuple[str, Hashable], tuple[tuple[Any, ...],
                                                  list[tuple[float, Hashable]]]]

        def _pool_value(self, pool: Pool, now: float) -> float: ...

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
