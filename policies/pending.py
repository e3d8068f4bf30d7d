"""The guard's ghost stores that wait for the engine's: a lookup is played on the ghosts
when it comes, its store when the engine's store of that request ends.

The engine stores a request's blocks when its prefill ends (a minute later for the agent
trace's long prompts, while other requests look up and store), so the ghosts
(:mod:`~kvstore.policies.guard`, :mod:`~kvstore.policies.shadow`) store then too:
:class:`PendingStores` keeps each lookup's ghost stores (a :class:`LookupStores`) until
the engine's store of its blocks ends (``Policy.on_stored``), a hint ends its request,
or, where the engine stores nothing (every block held, or nothing admitted), makes them
at once. Making them is the caller's: each call that may make some is handed ``play``
(the guard's, which stores on its three ghosts; handed, not kept: kept, it would make a
reference cycle with the policy, and a dropped policy and what it holds would wait for
the cyclic garbage collector). This keeps only which lookup waits for what.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstore.policies.base import BlockInfo, Hint, RequestInfo

__all__ = ["LookupStores", "PendingStores", "Play"]

#: At most this many lookups' ghost stores wait for the engine's (the oldest is made
#: first past it)
_MAX_PENDING = 1 << 12


class LookupStores:
    """A lookup's ghost stores, waiting for the engine's: the request, its block size,
    its time, the LRU ghost's hits (it stores the rest), the counts' and the bets'
    ghosts' blocks to store (None: not played)."""

    __slots__ = ("done", "f", "g", "now", "req", "size", "w")

    def __init__(self, req: RequestInfo, size: int, g: int, now: float) -> None:
        self.req = req
        self.size = size
        self.g = g
        self.f: list[int] | None = None
        self.w: list[BlockInfo] | None = None
        self.done = False
        self.now = now

    def any(self) -> bool:
        return self.g < len(self.req.keys) or bool(self.f) or bool(self.w)


#: Makes one lookup's stores on the ghosts, at the time it is given
Play = Callable[[LookupStores, float], None]


class PendingStores:
    """The ghosts' stores of the lookups whose engine stores have not come yet: the last
    lookup's (:meth:`add`, then :meth:`hold`), those waiting (oldest first), by request
    (session and request id) and by key. Each lookup's are made (``play``) once."""

    __slots__ = ("_by_key", "_by_request", "_last", "_pending")

    def __init__(self) -> None:
        self._last: LookupStores | None = None
        self._pending: dict[LookupStores, None] = {}
        self._by_request: dict[tuple[Hashable, Hashable], list[LookupStores]] = {}
        self._by_key: dict[Hashable, list[LookupStores]] = {}

    def add(self, req: RequestInfo, size: int, g: int, now: float) -> LookupStores:
        """The lookup of ``req`` just played on the ghosts at ``now`` (the LRU ghost hit
        ``g`` blocks): its stores, to fill in with the other ghosts' and then
        :meth:`hold` once the plan is known."""
        pend = self._last = LookupStores(req, size, g, now)
        return pend

    def hold(self, plan_admits: bool, play: Play) -> None:
        """The lookup just played (:meth:`add`): its ghosts' stores wait for the
        engine's (:meth:`stored`) or for the hint that ends its request
        (:meth:`flush`); they are made at once where the engine stores nothing (every
        block held, or nothing admitted)."""
        pend = self._last
        if pend is None:
            return
        self._last = None
        if not pend.any():
            return
        req = pend.req
        tiers = req.hit_tiers
        if None not in tiers or not plan_admits:
            self._store(pend, pend.now, play)
            return
        self._pending[pend] = None
        self._by_request.setdefault((req.session_id, req.request_id), []).append(pend)
        by_key = self._by_key
        for k in req.keys[tiers.index(None):]:
            got = by_key.get(k)
            if got is None:
                by_key[k] = [pend]
            else:
                got.append(pend)
        while len(self._pending) > _MAX_PENDING:
            self._store(next(iter(self._pending)), pend.now, play)

    def stored(self, keys: Sequence[Hashable], now: float, play: Play) -> None:
        """The engine stored ``keys`` (one request's): the waiting ghost stores of the
        lookup they came from (the one that waits on most of them, the oldest at a tie)
        are made now."""
        by_key = self._by_key
        if not by_key:
            return
        votes: dict[LookupStores, int] = {}
        for k in keys:
            got = by_key.get(k)
            if got is not None:
                for p in got:
                    votes[p] = votes.get(p, 0) + 1
        if votes:
            best = max(votes.values())
            for p in self._pending:  # (oldest first)
                if votes.get(p) == best:
                    self._store(p, now, play)
                    return

    def flush(self, hint: Hint, now: float, play: Play) -> None:
        """The hint ends its request (one of its session's, without a request id):
        the ghost stores still waiting for it are made now."""
        by_request = self._by_request
        if not by_request:
            return
        if hint.request_id is not None:
            got = by_request.get((hint.session_id, hint.request_id))
        else:
            got = [p for p in self._pending if p.req.session_id == hint.session_id]
        if got:
            for p in list(got):
                self._store(p, now, play)

    def _store(self, pend: LookupStores, now: float, play: Play) -> None:
        """Make ``pend``'s stores (``play``) unless they were made, and forget it."""
        if pend.done:
            return
        pend.done = True
        req = pend.req
        if pend in self._pending:
            del self._pending[pend]
            rk = (req.session_id, req.request_id)
            got = self._by_request.get(rk)
            if got is not None:
                if pend in got:
                    got.remove(pend)
                if not got:
                    del self._by_request[rk]
            by_key = self._by_key
            for k in req.keys[req.hit_tiers.index(None):]:
                lst = by_key.get(k)
                if lst is not None:
                    if pend in lst:
                        lst.remove(pend)
                    if not lst:
                        del by_key[k]
        play(pend, now)
