"""Which session owns each block of a tier, and the tier's sessions by class.

A block belongs to the session that used it last (a shared prefix moves to
whoever sent it most recently). Victims are taken session by session, the
session's tail first (its chain positions, highest first), and the
children-first rule of :mod:`kvstore.policies._prefix` still holds across
sessions. Sessions are grouped by the class of their wait and, within one,
kept oldest wait first, so the policy only scores the oldest session of each
class to find the worst one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator

from kvstore.policies._prefix import ChildIndex

__all__ = ["TierOwners"]


class TierOwners:
    __slots__ = ("_blocks", "_by_class", "_class_of", "capacity", "index", "owner", "pos",
                 "sizes", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.index = ChildIndex()
        self.owner: dict[Hashable, str] = {}
        self.pos: dict[Hashable, int] = {}
        self.sizes: dict[Hashable, int] = {}
        self._blocks: dict[str, dict[Hashable, None]] = {}
        #: class -> sessions present here, oldest wait first
        self._by_class: dict[Hashable, OrderedDict[str, None]] = {}
        self._class_of: dict[str, Hashable] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.sizes

    # -- blocks -------------------------------------------------------------------------
    def add(self, key: Hashable, parent: Hashable | None, size: int, session: str,
            cls: Hashable, pos: int) -> None:
        if key in self.sizes:
            return
        self.sizes[key] = size
        self.used += size
        self.pos[key] = pos
        self.index.add(key, parent, size)
        self._own(key, session, cls)

    def remove(self, key: Hashable) -> None:
        size = self.sizes.pop(key, None)
        if size is None:
            return
        self.used -= size
        self.pos.pop(key, None)
        self.index.remove(key)
        self._disown(key)

    def claim(self, key: Hashable, session: str, cls: Hashable, pos: int) -> None:
        """``session`` used ``key`` (at chain position ``pos``): it owns it now."""
        if key not in self.sizes:
            return
        self.pos[key] = pos
        if self.owner.get(key) != session:
            self._disown(key)
            self._own(key, session, cls)

    def _own(self, key: Hashable, session: str, cls: Hashable) -> None:
        self.owner[key] = session
        blocks = self._blocks.get(session)
        if blocks is None:
            blocks = self._blocks[session] = {}
            self._class_of[session] = cls
            self._by_class.setdefault(cls, OrderedDict())[session] = None
        blocks[key] = None

    def _disown(self, key: Hashable) -> None:
        session = self.owner.pop(key, None)
        if session is None:
            return
        blocks = self._blocks[session]
        del blocks[key]
        if not blocks:
            del self._blocks[session]
            cls = self._class_of.pop(session)
            group = self._by_class[cls]
            del group[session]
            if not group:
                del self._by_class[cls]

    # -- sessions -----------------------------------------------------------------------
    def blocks_of(self, session: str) -> dict[Hashable, None]:
        return self._blocks.get(session, {})

    def reclass(self, session: str, cls: Hashable) -> None:
        """``session`` now waits as ``cls`` (its wait starts now: youngest of the class)."""
        old = self._class_of.get(session)
        if old is None:
            return
        group = self._by_class[old]
        del group[session]
        if not group:
            del self._by_class[old]
        self._class_of[session] = cls
        self._by_class.setdefault(cls, OrderedDict())[session] = None

    def worst_first(self, value: Callable[[str], float], skip: str | None = None
                    ) -> Iterator[tuple[float, str]]:
        """(value, session) of the sessions here, lowest value first: a merge of each
        class's oldest sessions (within a class, a longer wait is worth less)."""
        heads: dict[Hashable, Iterator[str]] = {}
        front: list[tuple[float, Hashable, str]] = []
        for cls, group in self._by_class.items():
            it = iter(list(group))
            heads[cls] = it
            for s in it:
                if s != skip:
                    front.append((value(s), cls, s))
                    break
        while front:
            i = min(range(len(front)), key=lambda j: front[j][0])
            v, cls, s = front[i]
            yield v, s
            nxt = next((t for t in heads[cls] if t != skip), None)
            if nxt is None:
                front.pop(i)
            else:
                front[i] = (value(nxt), cls, nxt)

    def victims(self, value: Callable[[str], float]) -> Iterator[tuple[Hashable, int]]:
        """(key, size) candidates: sessions worst first, each one's tail first."""
        pos, sizes = self.pos, self.sizes
        for _v, s in self.worst_first(value):
            keys = sorted(self._blocks.get(s, ()), key=pos.__getitem__, reverse=True)
            for k in keys:
                yield k, sizes[k]
