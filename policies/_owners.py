"""Which session owns each block of a tier.

A block belongs to the session that used it last, or, once more than one
session has used it (a system prompt, a RAG document, a tool schema), to a
*pool* of shared blocks. Victims are taken group by group, least valuable
first: a session's blocks tail first (its chain positions, highest first), a
pool's least recently used first; the children-first rule of
:mod:`kvstore.policies._prefix` still holds across groups.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator

from kvstore.policies._prefix import ChildIndex

__all__ = ["POOL", "TierOwners"]

#: Owner names starting with this are pools of shared blocks (LRU inside).
POOL = "\0pool|"


class TierOwners:
    __slots__ = ("_blocks", "capacity", "index", "owner", "pos", "sizes", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.index = ChildIndex()
        self.owner: dict[Hashable, str] = {}
        self.pos: dict[Hashable, int] = {}
        self.sizes: dict[Hashable, int] = {}
        self._blocks: dict[str, dict[Hashable, None]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.sizes

    # -- blocks -------------------------------------------------------------------------
    def add(self, key: Hashable, parent: Hashable | None, size: int, session: str,
            pos: int) -> None:
        if key in self.sizes:
            return
        self.sizes[key] = size
        self.used += size
        self.pos[key] = pos
        self.index.add(key, parent, size)
        self._own(key, session)

    def remove(self, key: Hashable) -> None:
        size = self.sizes.pop(key, None)
        if size is None:
            return
        self.used -= size
        self.pos.pop(key, None)
        self.index.remove(key)
        self._disown(key)

    def claim(self, key: Hashable, session: str, pos: int) -> None:
        """``session`` (or a pool) used ``key`` (at chain position ``pos``): it owns it
        now (a pool's block becomes its most recently used)."""
        if key not in self.sizes:
            return
        self.pos[key] = pos
        if self.owner.get(key) != session or session.startswith(POOL):
            self._disown(key)
            self._own(key, session)

    def _own(self, key: Hashable, session: str) -> None:
        self.owner[key] = session
        blocks = self._blocks.get(session)
        if blocks is None:
            blocks = self._blocks[session] = {}
        blocks[key] = None

    def _disown(self, key: Hashable) -> None:
        session = self.owner.pop(key, None)
        if session is None:
            return
        blocks = self._blocks[session]
        del blocks[key]
        if not blocks:
            del self._blocks[session]

    # -- sessions -----------------------------------------------------------------------
    def blocks_of(self, session: str) -> dict[Hashable, None]:
        return self._blocks.get(session, {})

    def oldest(self, pool: str) -> Hashable | None:
        """The least recently used block of a pool."""
        return next(iter(self._blocks.get(pool, ())), None)

    def worst_first(self, value: Callable[[str], float], skip: str | None = None
                    ) -> list[tuple[float, str]]:
        """(value, session) of the sessions here, lowest value first."""
        return sorted((value(s), s) for s in self._blocks if s != skip)

    def victims(self, value: Callable[[str], float]) -> Iterator[tuple[Hashable, int]]:
        """(key, size) candidates: sessions worst first, each one's tail first."""
        pos, sizes = self.pos, self.sizes
        for _v, s in self.worst_first(value):
            blocks = self._blocks.get(s, ())
            keys = (list(blocks) if s.startswith(POOL)
                    else sorted(blocks, key=pos.__getitem__, reverse=True))
            for k in keys:
                yield k, sizes[k]
