"""The reuse counts and the tiers filed by them: the data structures behind
:class:`~kvstore.policies.frequency.FrequencyPolicy` and its ghost
(:class:`~kvstore.policies.shadow.FrequencyGhost`).

* :class:`ReuseCounts`: how many lookups each key was in, aged as TinyLFU's counts
  are (every count halved after a period of counted keys, weighed by their size).
* :class:`Counted`: one lookup's count pass, shared by the policy and its ghost so a
  lookup is counted once.
* :class:`CountTier`: one tier's blocks filed by count, least recently used first
  within a count (the policy's victims, lowest count first).

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from itertools import islice, repeat
from operator import rshift
from typing import NamedTuple

__all__ = ["CountTier", "Counted", "ReuseCounts", "zero_count"]


class ReuseCounts:
    """How many lookups each key was in, halved every ``period`` counted keys.

    Each counted key weighs its ``weight`` (the policy's: its block's bytes), so the
    period is a number of bytes looked up and does not depend on which block size came
    first (a server holds namespaces of several sizes: sized in blocks of the first
    lookup's 1 MiB, a period meant for 4 KiB blocks went by 256 times too fast, and each
    halving refiled every stored block before the lookup's answer).

    A halving touches no key: each key holds its count in units of ``1 << shift``, a
    count adds ``1 << shift``, and a halving adds one to ``shift``; a key's count is
    what it holds ``>> shift``: TinyLFU's halved counts exactly (``(c >> 1) + 1`` is
    ``(c * 2 + 2) >> 1``). Halving every key in a new dict held the loop 360 ms a
    period at two million counted keys. Keys whose count is 0 (the ones a
    halving forgets) stay until the cap forgets them, least recently counted first, or
    until every :data:`_RESCALE` halvings, when one pass divides what each key holds
    by its unit again (the numbers stay a few machine words) and drops them: that pass
    is the old halving's cost (130 ms at 1.1M keys, 230 ms at 2M), once per 32 periods.

    A plain dict in the order the keys were last counted (a counted key is popped and
    set again): C-level passes a third cheaper than an ``OrderedDict``'s get, update
    and ``move_to_end`` (the counts are every lookup's first pass over its keys)."""

    __slots__ = ("_counts", "_left", "_unit", "halvings", "max_tracked", "period", "shift")

    def __init__(self, period: int, max_tracked: int = 1 << 21) -> None:
        if period < 1 or max_tracked < 1:
            raise ValueError(f"period and max_tracked must be >= 1, got {period} and "
                             f"{max_tracked}")
        self.period = period
        self.max_tracked = max_tracked
        #: each key's count in units of ``1 << shift``
        self._counts: dict[Hashable, int] = {}
        self._left = period
        #: times every count was halved so far
        self.halvings = 0
        #: halvings since the counts were last rescaled
        self.shift = 0
        self._unit = 1

    def __getitem__(self, key: Hashable) -> int:
        return self._counts.get(key, 0) >> self.shift

    def __len__(self) -> int:
        """Keys tracked (those whose count halved to 0 included, until forgotten)."""
        return len(self._counts)

    def many(self, keys: Sequence[Hashable]) -> list[int]:
        """The counts of ``keys``, in order (C-level passes)."""
        held = map(self._counts.get, keys, repeat(0))
        return list(map(rshift, held, repeat(self.shift)) if self.shift else held)

    def add(self, keys: Sequence[Hashable], weight: int = 1) -> bool:
        """Count one lookup of ``keys``, each weighing ``weight``; True when it aged every
        count (halved them)."""
        counts = self._counts
        pop = counts.pop
        unit = self._unit
        for k in keys:  # (a key twice is counted twice, the last count its last)
            counts[k] = pop(k, 0) + unit
        self._bound()
        return self._aged(len(keys) * weight)

    def add_distinct(self, keys: Sequence[Hashable], weight: int = 1) -> list[int] | None:
        """:meth:`add` of distinct ``keys`` in C-level passes: their counts after it, in
        order, or None when it aged every count (the halved counts: read them afresh).
        The same counts and order as :meth:`add` (each key popped and set again: with no
        key twice, all of them last, in order)."""
        counts = self._counts
        held = list(map(self._unit.__add__, map(counts.pop, keys, repeat(0))))
        counts.update(zip(keys, held, strict=True))
        self._bound()
        if self._aged(len(keys) * weight):
            return None
        return list(map(rshift, held, repeat(self.shift))) if self.shift else held

    def _bound(self) -> None:
        """Forget the least recently counted keys past ``max_tracked``, in one pass from
        the dict's start, and 1/256 of the cap more (a dict's first key is found by
        scanning past the slots its pops left: once per batch, not once per key). At the
        cap of 2M keys, lookups of 1,000 new keys: 1/64 held one lookup in 32 for 5-8 ms,
        1/256 one in 8 for about 2 ms, the same CPU on the whole."""
        counts = self._counts
        over = len(counts) - self.max_tracked
        if over > 0:
            deque(map(counts.__delitem__,
                      list(islice(counts, over + self.max_tracked // 256))), 0)

    def _aged(self, added: int) -> bool:
        self._left -= added
        if self._left > 0:
            return False
        self._left = self.period
        self.halvings += 1
        self.shift += 1
        if self.shift >= _RESCALE:
            shift = self.shift
            self._counts = {k: c >> shift for k, c in self._counts.items() if c >> shift}
            self.shift = 0
        self._unit = 1 << self.shift
        return True


#: halvings between two passes that rescale what the counts hold (see :class:`ReuseCounts`)
_RESCALE = 32


def zero_count(key: Hashable, default: int) -> int:
    return 0


class Counted(NamedTuple):
    """One lookup's count pass: the counts (None: block sizes unknown yet, nothing
    counted), and for a chain of distinct keys not aged by it, the dict of the keys and
    their new counts in order (None otherwise: read them from the counts)."""

    counts: ReuseCounts | None
    distinct: dict[Hashable, None] | None
    news: list[int] | None


class CountTier:
    """A tier's blocks by count, least recently used first within a count."""

    __slots__ = ("at", "buckets", "capacity", "sizes", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.at: dict[Hashable, int] = {}  # key -> the count it is filed under
        self.sizes: dict[Hashable, int] = {}
        self.buckets: dict[int, dict[Hashable, None]] = {}

    def file(self, key: Hashable, count: int) -> None:
        """File ``key`` under ``count`` as its most recently used."""
        old = self.at.get(key)
        if old is not None:
            b = self.buckets[old]
            del b[key]
            if not b:
                del self.buckets[old]
        self.at[key] = count
        new = self.buckets.get(count)
        if new is None:
            new = self.buckets[count] = {}
        new[key] = None

    def file_many(self, keys: Sequence[Hashable], count: Callable[[Hashable, int], int],
                  distinct: dict[Hashable, None] | None = None,
                  counted: Sequence[int] | None = None) -> None:
        """:meth:`file` of each of ``keys`` it holds, in order, under ``count(key, 0)``.
        ``distinct``: ``dict.fromkeys(keys)``, and ``counted``: ``count`` of each key,
        where the caller has them already (one pass fewer each)."""
        at, buckets = self.at, self.buckets
        n = len(keys)
        if n > 1:
            olds = list(map(at.get, keys))
            old = olds[0]
            if old is not None and olds.count(old) == n:
                news = counted if counted is not None else list(map(count, keys, repeat(0)))
                c = news[0]
                moved = distinct if distinct is not None else (
                    dict.fromkeys(keys) if news.count(c) == n else None)
                if moved is not None and len(moved) == n and news.count(c) == n:
                    # Distinct keys, all filed under one count and going to one: out of
                    # the old bucket and appended to the new one in order, in C (the
                    # same buckets, in the same order, as one :meth:`file` each).
                    b = buckets[old]
                    if len(b) == n:  # (the bucket holds just these keys)
                        b.clear()
                    else:
                        deque(map(b.__delitem__, keys), 0)
                    if c != old:
                        at.update(dict.fromkeys(moved, c))  # (the hashes known)
                    if c != old and not b:
                        del buckets[old]
                    new = buckets.get(c)
                    if new is None:
                        new = buckets[c] = {}
                    new.update(moved)
                    return
        for k, c in zip(keys, counted if counted is not None else map(count, keys, repeat(0)),
                        strict=True):
            old = at.get(k)
            if old is None:
                continue
            b = buckets[old]
            del b[k]
            if not b:
                del buckets[old]
            at[k] = c
            new = buckets.get(c)
            if new is None:
                new = buckets[c] = {}
            new[k] = None

    def halve(self, times: int = 1) -> None:
        """Every count halved ``times`` times (the counts' halvings since the tier was
        filed: a ghost that plays only some lookups misses some): each bucket joins the
        one of its count halved, in C-level passes, lower count first (the keys of 2
        before those of 3, each in its order). Refiling every key under its halved
        count, one at a time, held the loop 89 ms per tier at 100,000 blocks, and the
        policy holds two."""
        at, old = self.at, self.buckets
        new: dict[int, dict[Hashable, None]] = {}
        for c in sorted(old):
            b = old[c]
            h = c >> times
            if h != c:
                at.update(zip(b, repeat(h)))
            into = new.get(h)
            if into is None:
                new[h] = b
            else:
                into.update(b)
        self.buckets = new

    def drop(self, key: Hashable) -> None:
        old = self.at.pop(key, None)
        if old is None:
            return
        self.used -= self.sizes.pop(key)
        b = self.buckets[old]
        del b[key]
        if not b:
            del self.buckets[old]

    def order(self) -> Iterator[Hashable]:
        """Keys, lowest count first, least recently used first within a count."""
        for c in sorted(self.buckets):
            yield from list(self.buckets[c])
