"""When sessions come back, learned online per class of wait.

A session *waits* from the end of a request (or a hint: waiting on a tool, on
its user) until its next request. Per class of wait (workload, what it waits
on, how many turns the session had) the model counts the waits started and
the gaps of those that ended, on a fixed grid of seconds. From these it
answers the one question the workload policy asks: of the sessions of a class
that have waited ``e`` seconds so far, what share comes back within the next
``w`` seconds (:meth:`ReturnTimes.rate`)? Waits that never end (sessions that
are gone) lower every share: they count as started and never as returned.

A class with few waits of its own borrows from its coarse parent (the first
two fields: workload and what it waits on): ``smoothing`` pseudo-waits drawn
from the parent's distribution, so a new class starts from its parent's answer.
Before anything is learned, ``prior`` pseudo-waits say that half of all waits end
within an hour, spread evenly over the grid's bins to the hour, and as much per bin
beyond it to the grid's end (so a cold policy still tells a fresh wait from an old
one, and an old wait from an ended one). Nothing here sees the future: a gap is
counted when the session comes back.

The grid reaches three hours, past the hour that a tool call waiting on a build, a
job or a person approving it often takes: with a grid ending at an hour, such a
return counted as never, and a session that had waited past the hour was worth
nothing, as an ended one, so it went first even where LRU kept it (the generated
``agent-noisy`` kind, whose hour-long calls have a median of an hour: at 40% of its
distinct blocks the guarded policy lost up to 0.81 points to LRU). The prior keeps
its mass per bin to the hour: spread thinner over the longer grid (half within three
hours) it cost 0.5 points on the real agent trace; with none past the hour the hour-long
waits were still worth nothing until enough came back.
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Hashable, Sequence

__all__ = ["GRID", "ReturnTimes"]

#: Bin upper edges, seconds (to three hours); returns after the last edge count as never.
GRID: tuple[float, ...] = (1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0,
                           120.0, 180.0, 240.0, 300.0, 450.0, 600.0, 900.0, 1200.0, 1800.0,
                           2700.0, 3600.0, 5400.0, 7200.0, 10800.0)
_N = len(GRID)
#: The cold-start distribution: half of all waits end within the hour, as much per bin
#: after it.
_HOUR = GRID.index(3600.0) + 1
_PRIOR = [0.5 / _HOUR] * _N


class _Counts:
    __slots__ = ("cdf", "cnt", "dirty", "n")

    def __init__(self) -> None:
        self.n = 0.0  # waits started
        self.cnt = [0.0] * _N  # waits ended, by gap bin
        self.cdf: list[float] | None = None  # share back by each edge (cached)
        self.dirty = 0


def _coarse(cls: Hashable) -> Hashable:
    return cls[:2] if isinstance(cls, tuple) else cls


class ReturnTimes:
    """Per-class counts of waits and their gaps; shares back within a window."""

    __slots__ = ("_classes", "prior", "refresh", "smoothing")

    def __init__(self, smoothing: float = 20.0, prior: float = 1.0, refresh: int = 16) -> None:
        self._classes: dict[Hashable, _Counts] = {}
        self.smoothing = smoothing
        self.prior = prior
        self.refresh = refresh

    def _get(self, cls: Hashable) -> _Counts:
        c = self._classes.get(cls)
        if c is None:
            c = self._classes[cls] = _Counts()
        return c

    def _both(self, cls: Hashable) -> tuple[_Counts, ...]:
        parent = _coarse(cls)
        return (self._get(cls),) if parent == cls else (self._get(cls), self._get(parent))

    def start(self, cls: Hashable, n: int = 1) -> None:
        """A wait of ``cls`` began (``n`` of them)."""
        for c in self._both(cls):
            c.n += n
            c.dirty += n

    def cancel(self, cls: Hashable) -> None:
        """A wait of ``cls`` turned out to be another (a hint re-classed it at once)."""
        for c in self._both(cls):
            c.n = max(0.0, c.n - 1)
            c.dirty += 1

    def returned(self, cls: Hashable, gap_s: float) -> None:
        """A wait of ``cls`` ended after ``gap_s`` seconds (beyond the grid: never)."""
        i = bisect.bisect_left(GRID, gap_s)
        if i >= _N:
            return
        for c in self._both(cls):
            c.cnt[i] += 1
            c.dirty += 1

    def returned_many(self, cls: Hashable, gaps: Sequence[float]) -> None:
        """:meth:`returned` of each gap."""
        if not gaps:
            return
        # Per bin, not per gap (a lookup's shared prefix is one gap per block, and
        # they fall in a few bins): counted in C, then one add per bin (whole numbers,
        # so the sum is the one adding 1 per gap made).
        tally = Counter(map(functools.partial(bisect.bisect_left, GRID), gaps))
        ended = sum(m for i, m in tally.items() if i < _N)
        for c in self._both(cls):
            cnt = c.cnt
            for i, m in tally.items():
                if i < _N:
                    cnt[i] += m
            c.dirty += ended

    def waits(self, cls: Hashable) -> float:
        c = self._classes.get(cls)
        return c.n if c is not None else 0.0

    def _cdf(self, cls: Hashable, keep: bool = True) -> list[float]:
        c = self._get(cls)
        if c.cdf is not None and c.dirty < self.refresh:
            return c.cdf
        parent = _coarse(cls)
        p = self._classes.get(parent) if parent != cls else None
        a = self.smoothing / (p.n + 1.0) if p is not None and self.smoothing else 0.0
        prior = self.prior
        n = c.n + prior + (a * p.n if p is not None else 0.0)
        acc = 0.0
        cdf = []
        for i in range(_N):
            acc += c.cnt[i] + prior * _PRIOR[i] + (a * p.cnt[i] if p is not None else 0.0)
            cdf.append(min(1.0, acc / n))
        if keep:
            c.cdf = cdf
            c.dirty = 0
        return cdf

    def back_by(self, cls: Hashable, t: float, keep: bool = True) -> float:
        """Share of waits of ``cls`` over within ``t`` seconds (linear within a bin).
        ``keep=False``: a fresh answer that leaves the cached one (and when it is next
        refreshed) as it was."""
        if t <= 0:
            return 0.0
        cdf = self._cdf(cls, keep)
        i = bisect.bisect_left(GRID, t)
        if i >= _N:
            return cdf[-1]
        lo_t = GRID[i - 1] if i else 0.0
        lo = cdf[i - 1] if i else 0.0
        return lo + (cdf[i] - lo) * (t - lo_t) / (GRID[i] - lo_t)

    def rate(self, cls: Hashable, elapsed: float, window: float) -> float:
        """Of the waits of ``cls`` still running after ``elapsed`` s, the share that
        ends within the next ``window`` s."""
        f0 = self.back_by(cls, elapsed)
        alive = 1.0 - f0
        if alive <= 1e-9:
            return 0.0
        return max(0.0, self.back_by(cls, elapsed + window) - f0) / alive

    def median(self, cls: Hashable) -> float | None:
        """Median gap of the waits of ``cls`` that ended (None before any did)."""
        c = self._classes.get(cls)
        if c is None or not any(c.cnt):
            return None
        half = sum(c.cnt) / 2.0
        acc = 0.0
        for i, k in enumerate(c.cnt):
            acc += k
            if acc >= half:
                return GRID[i]
        return None
