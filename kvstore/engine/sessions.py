"""Sessions: who uses which blocks, scoped by namespace, inferred when unnamed.

A session is a :class:`~kvstore.types.SessionKey` ``(namespace, session_id)``: two
tenants (or models) with the same session id are two sessions, and a hint acts on
one namespace only. The policy sees that key as the session (never a string joined
from the two: a namespace may hold any character).

A request without a session id continues the session that owns the deepest
block it shares with what came before, unless that block is a branch point
(another request already extended it with a different block): then the shared
part is a common prefix (a system prompt) and the request starts a new session.
So conversations that share a system prompt are never merged into one session.

Every session remembers the blocks it used; a block is *needed* by every live
session that used it, and is *shared* once two sessions have used it (a system
prompt, a RAG document, a batch's template: the next session will likely want
it too). A session ends at ``session_end`` or when idle for ``ttl_s``; the
engine drops a block for a session's end only when it was never shared and no
other live session needs it. Memory is bounded: at most ``max_sessions``
sessions (the least recently active end first), and ``max_inferred`` remembered
block owners per namespace and shared blocks (older generations are forgotten).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from itertools import compress, filterfalse, repeat
from operator import ne

from kvstore.types import SessionKey

__all__ = ["Sessions"]

_PLUS_ONE = (1).__add__


class _Inferer:
    """Session of a request from its prefix chain (one namespace); two generations of
    block owners bound the memory."""

    __slots__ = ("_child", "_limit", "_next", "_old_child", "_old_owner", "_owner")

    def __init__(self, limit: int) -> None:
        self._owner: dict[Hashable, str] = {}
        self._child: dict[Hashable, Hashable] = {}
        self._old_owner: dict[Hashable, str] = {}
        self._old_child: dict[Hashable, Hashable] = {}
        self._limit = limit
        self._next = 0

    def _get_owner(self, h: Hashable) -> str | None:
        o = self._owner.get(h)
        return o if o is not None else self._old_owner.get(h)

    def session_for(self, hashes: Sequence[Hashable]) -> str:
        if hashes and all(map(self._owner.__contains__, hashes)) and \
                all(map(self._child.__contains__, hashes[:-2])):
            # A chain seen whole before, in this generation (a repeat lookup of a stored
            # prefix): its deepest block's owner, and nothing to record. Two membership
            # passes in C instead of two Python loops over the chain (the same answer
            # as the loops below give it).
            return self._owner[hashes[-1]]
        return self._walk(hashes)

    def _walk(self, hashes: Sequence[Hashable]) -> str:
        """:meth:`session_for` the long way: find the deepest known block, then record
        the chain's owners and children."""
        deepest = -1
        cur, old = self._owner, self._old_owner
        for j, h in enumerate(hashes):
            if h not in cur and old.get(h) is None:
                break
            deepest = j
        session: str | None = None
        if deepest >= 0:
            d = hashes[deepest]
            nxt = hashes[deepest + 1] if deepest + 1 < len(hashes) else None
            known = self._child.get(d, self._old_child.get(d))
            if nxt is None or known is None or known == nxt:
                session = self._get_owner(d)
        if session is None:
            session = f"~{self._next}"
            self._next += 1
        owner, child = self._owner, self._child
        last = len(hashes) - 1
        for j, h in enumerate(hashes):
            if h not in owner:
                owner[h] = self._old_owner.get(h, session)
            if 0 < j < last:
                prev = hashes[j - 1]
                if prev not in child:
                    child[prev] = self._old_child.get(prev, h)
        if len(owner) > self._limit:
            self._old_owner, self._owner = owner, {}
            self._old_child, self._child = child, {}
        return session


@dataclass(slots=True)
class _Session:
    keys: dict[Hashable, None] = field(default_factory=dict)
    last: float = 0.0


class Sessions:
    """Blocks per session, live sessions per block, and session inference."""

    def __init__(self, ttl_s: float = 7200.0, max_sessions: int = 200_000,
                 max_inferred: int = 2_000_000) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_inferred = max_inferred
        self._sessions: OrderedDict[SessionKey, _Session] = OrderedDict()
        #: key -> live sessions that used it
        self._users: dict[Hashable, int] = {}
        #: key -> the first session that used it, or None once a second one did
        #: (two generations, so memory stays bounded)
        self._first: dict[Hashable, SessionKey | None] = {}
        self._old_first: dict[Hashable, SessionKey | None] = {}
        self._inferers: dict[str, _Inferer] = {}

    def infer(self, namespace: str, hashes: Sequence[Hashable]) -> str:
        """A session id (of ``namespace``) for a request that named none (see the
        module docstring)."""
        inf = self._inferers.get(namespace)
        if inf is None:
            inf = self._inferers[namespace] = _Inferer(self.max_inferred)
        return inf.session_for(hashes)

    def used(self, session: SessionKey, keys: Sequence[Hashable], now: float) -> None:
        """``session`` used ``keys`` at ``now``."""
        s = self._sessions.get(session)
        if s is None:
            s = self._sessions[session] = _Session()
        else:
            self._sessions.move_to_end(session)
        s.last = now
        mine, users, first = s.keys, self._users, self._first
        # The keys new to the session (its own prefix again: none), in order, once each,
        # recorded in C-level passes: what a loop over them setting each key's users
        # and first user would record, in the same order.
        new = dict.fromkeys(filterfalse(mine.__contains__, keys))
        if new:
            mine.update(new)
            users.update(zip(new, map(_PLUS_ONE, map(users.get, new, repeat(0))),
                             strict=True))
            # first user: a key seen first by another session is shared from now on
            known = list(filter(first.__contains__, new))
            first.update(dict.fromkeys(compress(known, map(ne, map(
                first.__getitem__, known), repeat(session))), None))
            if len(known) < len(new):
                unseen = list(filterfalse(first.__contains__, new)) if known else list(new)
                first.update(dict.fromkeys(unseen, session))
                first.update(dict.fromkeys(compress(unseen, map(ne, map(
                    self._old_first.get, unseen, repeat(session)), repeat(session))), None))
        if len(first) > self.max_inferred:
            self._old_first, self._first = first, {}
        self.expire(now)

    def keys(self, session: SessionKey) -> list[Hashable]:
        s = self._sessions.get(session)
        return list(s.keys) if s is not None else []

    def shared(self, key: Hashable) -> bool:
        """True once two sessions have used ``key``."""
        if key in self._first:
            return self._first[key] is None
        return key in self._old_first and self._old_first[key] is None

    def end(self, session: SessionKey) -> list[Hashable]:
        """End a session; returns its keys no other live session needs and no other
        session ever used (its private blocks)."""
        s = self._sessions.pop(session, None)
        if s is None:
            return []
        free = []
        users = self._users
        for k in s.keys:
            n = users.get(k, 0) - 1
            if n <= 0:
                users.pop(k, None)
                if not self.shared(k):
                    free.append(k)
            else:
                users[k] = n
        return free

    def expire(self, now: float) -> None:
        sessions = self._sessions
        while sessions:
            name, s = next(iter(sessions.items()))
            if len(sessions) <= self.max_sessions and now - s.last <= self.ttl_s:
                return
            self.end(name)

    def __len__(self) -> int:
        return len(self._sessions)
