"""LRU's ghost: what LRU would hold over a tier's capacity, keys only.

The baseline the adaptive policy's guard (:mod:`~kvstore.policies.guard`) scores its
bets against, paired, request by request: exact for LRU (a request's prefix hits up
to its first miss, then every key touched, last block first; victims taken by the
engine's rule, a chain's leaves before its ancestors), so the score is the trace's
hits minus the hits LRU would have made.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence

from kvstore.policies.children import ChildIndex, ghost_take
from kvstore.policies.lru import _at_the_end
from kvstore.policies.shadow import Retained

__all__ = ["LRUGhost"]


class LRUGhost:
    """LRU over keys only, ``capacity`` bytes: what LRU would hold (no payloads), its
    victims taken by the engine's rule (a chain's leaves before its ancestors: the
    adaptive policy links a request's decode blocks under their prompt from the stores).

    It also remembers the keys it evicted, up to ``capacity`` bytes more (ARC's B list):
    ``lost`` is how many keys of the last request were there, LRU's misses for want of
    room (the rest of its misses are keys it never saw, or saw too long ago)."""

    __slots__ = ("capacity", "children", "gone", "gone_used", "keys", "lost", "retained",
                 "used")

    def __init__(self, capacity: int, retained: Retained | None = None) -> None:
        self.capacity = capacity
        self.retained = retained
        self.keys: OrderedDict[Hashable, int] = OrderedDict()
        #: the chains the lookups showed (a key's parent: the key before it), so that
        #: victims go as the engine takes them (:func:`~kvstore.policies.children.ghost_take`)
        self.children = ChildIndex()
        self.used = 0
        self.gone: OrderedDict[Hashable, int] = OrderedDict()
        self.gone_used = 0
        self.lost = 0

    def request(self, keys: Sequence[Hashable], size: int, now: float = 0.0,
                own: Sequence[Hashable] = ()) -> int:
        """Play one lookup and its store at once, as LRU would; returns its prefix hits.
        ``own``: more keys the store keeps (the chain a request's decode blocks
        continue)."""
        hits = self._prefix(keys)
        if hits < len(keys):
            self.lost = self.store(keys, 0, size, now, own)
        return hits

    def lookup(self, keys: Sequence[Hashable]) -> int:
        """Play one lookup alone (its hits touched, tail first); returns its prefix hits.
        The store of the rest waits for :meth:`store` (the engine stores a request's
        blocks when its prefill ends)."""
        hits = self._prefix(keys)
        if hits < len(keys):
            deque(map(self.keys.move_to_end, reversed(keys[:hits])), 0)
            gone = self.gone
            self.lost = sum(map(gone.__contains__, keys[hits:])) if gone else 0
        return hits

    def _prefix(self, keys: Sequence[Hashable]) -> int:
        """The prefix hits of ``keys``. All held: each touched, last block first, and
        ``lost`` 0 (there is nothing to store); else nothing is touched."""
        ghost = self.keys
        if keys and _at_the_end(ghost, keys[::-1]):  # the last lookup's, again: nothing
            self.lost = 0  # to move
            return len(keys)
        try:  # all held: each touched, last block first, in one pass
            deque(map(ghost.move_to_end, reversed(keys)), 0)
            self.lost = 0
            return len(keys)
        except KeyError:
            pass  # one not held: the caller makes every move again, in order
        hits = 0
        for k in keys:
            if k not in ghost:
                break
            hits += 1
        return hits

    def store(self, keys: Sequence[Hashable], start: int, size: int, now: float = 0.0,
              own: Sequence[Hashable] = ()) -> int:
        """Store ``keys[start:]`` as the engine's store of a request does (each touched or
        added, last block first; then room made, the request's blocks and ``own``
        kept; what still does not fit is the request's own added tail, cut). Returns
        how many of them were keys it had evicted."""
        ghost = self.keys
        move = ghost.move_to_end
        gone = self.gone
        lost = 0
        #: the keys added, each with its parent and size (as ChildIndex.add_many takes them)
        added: list[tuple[Hashable, Hashable | None, int]] = []
        j = len(keys)
        for k in reversed(keys[start:]):  # the engine's order: the first block ends most recent
            j -= 1
            if k in ghost:
                move(k)
            else:
                n = gone.pop(k, None)
                if n is not None:
                    lost += 1
                    self.gone_used -= n
                self.used += size
                ghost[k] = size
                added.append((k, keys[j - 1] if j else None, size))
        self.children.add_many(added)
        if self.used > self.capacity:
            shield = (self.retained.shield(ghost, self.capacity, now) if self.retained
                      else None)
            keep = set(keys)
            if own:
                keep.update(own)
            for k in ghost_take(self.children, lambda: iter(ghost), keep, ghost,
                                self.used - self.capacity, shield):
                if k in ghost:
                    self._evict(k)
        for k, _, _ in added:  # (the request alone fills it: its own tail goes, as the engine's)
            if self.used <= self.capacity:
                break
            if k in ghost:
                self._evict(k)
        while self.used > self.capacity and ghost:
            self._evict(next(iter(ghost)))
        while self.gone_used > self.capacity and gone:
            self.gone_used -= gone.popitem(last=False)[1]
        return lost

    def _evict(self, key: Hashable) -> None:
        n = self.keys.pop(key)
        self.children.remove(key)
        self.used -= n
        self.gone[key] = n
        self.gone_used += n
