"""Which session owns each block of a tier.

A block belongs to the session that used it last, or, once more than one
session has used it (a system prompt, a RAG document, a tool schema), to a
*pool* of shared blocks. Victims are taken group by group, least valuable
first: a session's blocks tail first (its chain positions, highest first), a
pool's least recently used first; the engine's eviction manager
(:mod:`kvstore.engine.eviction`) still takes children before parents across
groups.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

__all__ = ["Pool", "TierOwners"]


@dataclass(frozen=True, slots=True)
class Pool:
    """The owner of a workload's shared blocks (LRU inside). Its own type: no session
    (whatever hashable the engine names sessions by) can be taken for a pool."""

    workload: str

_VALUE = itemgetter(0)


class TierOwners:
    __slots__ = ("_blocks", "_bytes", "capacity", "groups", "owner", "pools", "pos", "sizes",
                 "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        #: key -> its session (or Pool)
        self.owner: dict[Hashable, Hashable] = {}
        self.pos: dict[Hashable, int] = {}
        self.sizes: dict[Hashable, int] = {}
        self._blocks: dict[Hashable, dict[Hashable, None]] = {}
        #: each owner's bytes here (summing its blocks' sizes for each victim session
        #: cost a lookup that needed room 5-15 ms with a session of 100,000 blocks)
        self._bytes: dict[Hashable, int] = {}
        #: bumped whenever an owner gains its first block here or loses its last (the
        #: owners here, and the order they came in, are the same while it stays)
        self.groups = 0
        #: the pools among the owners here
        self.pools: dict[Pool, None] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.sizes

    # -- blocks -------------------------------------------------------------------------
    def add(self, key: Hashable, size: int, session: Hashable, pos: int) -> None:
        if key in self.sizes:
            return
        self.sizes[key] = size
        self.used += size
        self.pos[key] = pos
        self._own(key, session)

    def remove(self, key: Hashable) -> None:
        size = self.sizes.get(key)
        if size is None:
            return
        self.used -= size
        self.pos.pop(key, None)
        self._disown(key)
        del self.sizes[key]

    def claim(self, key: Hashable, session: Hashable, pos: int) -> None:
        """``session`` (or a pool) used ``key`` (at chain position ``pos``): it owns it
        now (a pool's block becomes its most recently used)."""
        if key not in self.sizes:
            return
        self.pos[key] = pos
        owner = self.owner.get(key)
        if owner is session:  # (the policy passes one Pool object per workload)
            if isinstance(session, Pool):  # the pool's newest now
                blocks = self._blocks[session]
                del blocks[key]
                blocks[key] = None
        elif owner != session or isinstance(session, Pool):
            self._disown(key)
            self._own(key, session)

    def claim_many(self, claims: Iterable[tuple[Hashable, Hashable, int]]) -> None:
        """:meth:`claim` of each ``(key, session, pos)``, in order (one call for a
        lookup's blocks)."""
        sizes, pos, owners, groups = self.sizes, self.pos, self.owner, self._blocks
        for key, session, p in claims:
            if key not in sizes:
                continue
            pos[key] = p
            owner = owners.get(key)
            if owner is session:
                if isinstance(session, Pool):  # the pool's newest now
                    blocks = groups[session]
                    del blocks[key]
                    blocks[key] = None
            elif owner != session or isinstance(session, Pool):
                self._disown(key)
                self._own(key, session)

    def claim_run(self, keys: Sequence[Hashable], session: Hashable,
                  at: dict[Hashable, int] | None = None) -> None:
        """:meth:`claim_many` of ``(keys[j], session, j)`` for every ``j``: where the
        session owns every one of them already, only their positions, in one C-level
        pass (a session's prefix coming back); where a pool does (distinct keys: a
        shared prefix coming back), their positions and each its newest, in C too.
        ``at``: ``dict(zip(keys, range(len(keys))))`` of distinct keys, where the caller
        has it (their hashes are not computed again)."""
        n = len(keys)
        # (a key owned is a key stored here: claims skip the others, removals disown)
        if session is not None and list(map(self.owner.get, keys)).count(session) == n:
            if not isinstance(session, Pool):
                self.pos.update(zip(keys, range(n), strict=True) if at is None else at)
                return
            if at is None:
                at = dict(zip(keys, range(n), strict=True))
            if len(at) == n:
                self.pos.update(at)  # (the hashes known)
                # out of the pool's order and back at its end, in order
                blocks = self._blocks[session]
                if len(blocks) == n:  # (the pool holds just these keys)
                    blocks.clear()
                else:
                    deque(map(blocks.__delitem__, keys), 0)
                blocks.update(dict.fromkeys(at))
                return
        self.claim_many(zip(keys, repeat(session), range(n)))

    def _own(self, key: Hashable, session: Hashable) -> None:
        """``session`` owns ``key`` (stored here: its size known), which no one owns."""
        self.owner[key] = session
        blocks = self._blocks.get(session)
        if blocks is None:
            blocks = self._blocks[session] = {}
            self._bytes[session] = 0
            self.groups += 1
            if isinstance(session, Pool):
                self.pools[session] = None
        blocks[key] = None
        self._bytes[session] += self.sizes[key]

    def _disown(self, key: Hashable) -> None:
        """No one owns ``key`` (still in :attr:`sizes`) from now."""
        session = self.owner.pop(key, None)
        if session is None:
            return
        blocks = self._blocks[session]
        del blocks[key]
        if not blocks:
            del self._blocks[session]
            del self._bytes[session]
            self.groups += 1
            if isinstance(session, Pool):
                del self.pools[session]
        else:
            self._bytes[session] -= self.sizes[key]

    # -- sessions -----------------------------------------------------------------------
    def blocks_of(self, session: Hashable) -> dict[Hashable, None]:
        return self._blocks.get(session, {})

    def bytes_of(self, session: Hashable) -> int:
        """The bytes of ``session``'s (or a pool's) blocks here."""
        return self._bytes.get(session, 0)

    def oldest(self, pool: Pool) -> Hashable | None:
        """The least recently used block of a pool."""
        return next(iter(self._blocks.get(pool, ())), None)

    def worst_first(self, value: Callable[[Hashable], float], skip: Hashable | None = None
                    ) -> list[tuple[float, Hashable]]:
        """(value, session) of the sessions here, lowest value first (equal values in
        the order the sessions came to own blocks here: sessions need not be ordered)."""
        return sorted(((value(s), s) for s in self._blocks if s != skip), key=_VALUE)

    def victims(self, order: Callable[[], Iterable[tuple[float, Hashable]]]
                ) -> Iterator[Hashable]:
        """Keys, owners in the order ``order()`` gives (:meth:`worst_first`'s, asked
        for when the first key is read), each one's tail first."""
        pos = self.pos
        for _v, s in order():
            blocks = self._blocks.get(s, ())
            yield from (list(blocks) if isinstance(s, Pool)
                        else sorted(blocks, key=pos.__getitem__, reverse=True))
