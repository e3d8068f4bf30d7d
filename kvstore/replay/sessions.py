"""Infer sessions from prefix chains when a trace carries no ``session_id``.

A request continues the session that owns the deepest block it shares with
what came before, unless that block is a branch point (another request already
extended it with a different full block): then the shared part is a common
prefix (a system prompt) and the request starts a new session. A request's
last block is usually partial, so it never counts as an extension.
"""

from __future__ import annotations

from collections.abc import Sequence


class SessionInferer:
    __slots__ = ("_child", "_next_id", "_owner")

    def __init__(self) -> None:
        self._owner: dict[int, str] = {}
        self._child: dict[int, int] = {}
        self._next_id = 0

    def session_for(self, hash_ids: Sequence[int]) -> str:
        owner = self._owner
        deepest = -1
        for j, h in enumerate(hash_ids):
            if h in owner:
                deepest = j
            else:
                break
        session: str | None = None
        if deepest >= 0:
            d = hash_ids[deepest]
            nxt = hash_ids[deepest + 1] if deepest + 1 < len(hash_ids) else None
            known = self._child.get(d)
            if nxt is None or known is None or known == nxt:
                session = owner[d]
        if session is None:
            session = f"s{self._next_id}"
            self._next_id += 1
        for j, h in enumerate(hash_ids):
            if h not in owner:
                owner[h] = session
            if 0 < j < len(hash_ids) - 1:
                self._child.setdefault(hash_ids[j - 1], h)
        return session
