"""A workload policy's HBM keep: asked only where it pays.

Part of :class:`~kvstore.policies.workload.WorkloadPolicy` (its keep half). The HBM
keep (``Plan.keep_s``: the engine holds a finished request's blocks for the session's
next request) is asked only where it pays: every keep considered (a tool call or user
turn whose class is back soon) is judged when the session is back, held or not
(:mod:`~kvstore.policies.holds`): was it back within the keep, for the prefix held, and
would the sidecar not have served that prefix nearly as fast itself? A class whose
keeps gain less than half of what they pin asks none. Before a class is judged, a keep
is asked for the gap the client gave, or where the sidecar will not hold the request's
prefix in a fast tier. Where the lookup says what the engine's own cache held
(``RequestInfo.engine_hit``), what it kept by itself gains nothing, asked keeps go
unjudged and one in four is left unasked to keep judging (the ledger's probe).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

from kvstore.policies.base import RequestInfo
from kvstore.policies.holds import HoldLedger, PendingHold
from kvstore.policies.sessions import _WAIT, _Session

if TYPE_CHECKING:
    from kvstore.policies.returns import ReturnTimes

__all__ = ["Keeps"]

#: Waits of a class seen before its statistics may decide an HBM keep.
_KEEP_MIN_WAITS = 8


class Keeps:
    """The HBM keep's decision and its ledger, a part of
    :class:`~kvstore.policies.workload.WorkloadPolicy`."""

    if TYPE_CHECKING:
        # What this part reads of the policy (set in Policy.__init__ and
        # WorkloadPolicy.__init__).
        _order: dict[str, int]
        hbm_keep_max_s: float
        holds: HoldLedger
        returns: ReturnTimes
        _sessions: OrderedDict[Hashable, _Session]
        _worth: tuple[bool, ...]

        def _tool(self, workload: str, tool: str | None) -> str: ...
        @staticmethod
        def _cls(s: _Session, wait: str, tool: str) -> tuple[str, str, str, int, int]: ...

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
