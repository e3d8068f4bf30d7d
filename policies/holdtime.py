"""Per-class hold times: how long a block is worth keeping after a use.

Per class of block we learn online (from lookups only: the policy never sees
the future) how many lifetimes started and when the ones that came back did
(return gaps on a fixed grid of seconds). Holding a block of class ``c`` for
``T`` seconds after a use buys ``hits_c(T)`` returns for ``space_c(T)``
block-seconds of cache. With a price ``lam`` per block-second, the best hold
time is ``argmax_T hits_c(T) - lam * space_c(T)`` (0: not worth admitting):
the Lagrangian optimum of per-class holding times. ``lam`` is the price at
which the classes' demand for cache fills the tier (:meth:`HoldModel.solve`).

Sparse classes lean on a coarser parent class (``coarse(cls)``): their counts
are topped up with ``smoothing`` pseudo-lifetimes drawn from the parent's
distribution, so a new class starts from its parent's hold time.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable

__all__ = ["GRID", "HoldModel"]

#: Hold times tried, seconds.
GRID: tuple[float, ...] = (0.0, 3.0, 6.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 75.0,
                           90.0, 105.0, 120.0, 150.0, 180.0, 210.0, 250.0, 300.0, 350.0,
                           400.0, 500.0, 600.0, 700.0, 850.0, 1000.0, 1250.0, 1500.0,
                           2000.0, 2500.0, 3000.0, 3600.0)


class _Stats:
    __slots__ = ("at", "cnt", "hold", "lam", "n", "since", "total")

    def __init__(self) -> None:
        self.n = 0  # lifetimes started
        self.cnt = [0] * len(GRID)  # returns with gap in (GRID[i-1], GRID[i]]
        self.total = [0.0] * len(GRID)  # sum of those gaps
        self.hold: float | None = None  # cached best hold time
        self.lam = 0.0  # the price it was computed at
        self.since = 0  # returns since then
        self.at = 0.0  # when


#: (hold times, block-seconds per lifetime, hits per lifetime, lifetimes seen / counted)
_Hull = tuple[list[float], list[float], list[float], float]


class HoldModel:
    """Per-class return counts on :data:`GRID`, turned into hold times at a price."""

    __slots__ = ("_coarse", "_fine", "_parents", "prior", "recheck_s", "refresh", "smoothing")

    def __init__(self, coarse: Callable[[Hashable], Hashable], smoothing: float = 20.0,
                 prior: float = 0.5, refresh: int = 8, recheck_s: float = 30.0) -> None:
        self._coarse = coarse
        self._fine: dict[Hashable, _Stats] = {}
        self._parents: dict[Hashable, _Stats] = {}
        self.smoothing = smoothing
        self.prior = prior
        self.refresh = refresh
        self.recheck_s = recheck_s

    def _pair(self, cls: Hashable) -> tuple[_Stats, _Stats]:
        s = self._fine.get(cls)
        if s is None:
            s = self._fine[cls] = _Stats()
        key = self._coarse(cls)
        p = self._parents.get(key)
        if p is None:
            p = self._parents[key] = _Stats()
        return s, p

    def start(self, cls: Hashable) -> None:
        s, p = self._pair(cls)
        s.n += 1
        p.n += 1

    def unstart(self, cls: Hashable) -> None:
        s, p = self._pair(cls)
        s.n = max(0, s.n - 1)
        p.n = max(0, p.n - 1)

    def returned(self, cls: Hashable, gap_s: float) -> None:
        i = bisect.bisect_left(GRID, gap_s)
        if i >= len(GRID):
            return
        for st in self._pair(cls):
            st.cnt[i] += 1
            st.total[i] += gap_s
            st.since += 1

    def invalidate(self) -> None:
        """Forget every cached hold time (they are recomputed on next use)."""
        for st in (*self._fine.values(), *self._parents.values()):
            st.hold = None

    def observations(self, cls: Hashable) -> tuple[int, int]:
        """(lifetimes started, returns seen within the grid) for ``cls``."""
        s = self._fine.get(cls)
        return (0, 0) if s is None else (s.n, sum(s.cnt))

    def hold(self, cls: Hashable, lam: float, now: float) -> float:
        """Best hold time of a block of ``cls`` at price ``lam`` (0: not worth a slot)."""
        s = self._fine.get(cls)
        if s is None:
            s, _ = self._pair(cls)
        if (s.hold is None or s.since >= self.refresh or now - s.at > self.recheck_s
                or abs(s.lam - lam) > 0.02 * lam):
            s.hold = self._best(s, self._parents[self._coarse(cls)], lam)[0]
            s.lam = lam
            s.since = 0
            s.at = now
        return s.hold

    def _best(self, s: _Stats, p: _Stats, lam: float) -> tuple[float, float]:
        """(hold time, block-seconds per lifetime started) maximising hits - lam * space."""
        ts, xs, ys, scale = self._hull(s, p)
        j = self._pick(xs, ys, lam)
        return ts[j], xs[j] * scale

    def _hull(self, s: _Stats, p: _Stats) -> _Hull:
        """The hold times whose (space, hits) per lifetime can maximise hits - lam * space
        for some lam > 0 (the upper hull from (0, 0)), with those points, and s.n / n.
        Sparse classes are topped up with ``smoothing`` pseudo-lifetimes from ``p``."""
        a = self.smoothing / (p.n + 1.0) if self.smoothing else 0.0
        n = s.n + self.prior + a * p.n
        ts, xs, ys = [0.0], [0.0], [0.0]
        hits = gaps = 0.0
        for i, t in enumerate(GRID):
            hits += s.cnt[i] + a * p.cnt[i]
            gaps += s.total[i] + a * p.total[i]
            x, y = gaps + t * max(n - hits, 0.0), hits
            if x <= xs[-1]:
                if y <= ys[-1]:
                    continue
                ts.pop()  # more hits for no more space: dominates the last point
                xs.pop()
                ys.pop()
            while len(xs) >= 2 and ((ys[-1] - ys[-2]) * (x - xs[-1])
                                    <= (y - ys[-1]) * (xs[-1] - xs[-2])):
                ts.pop()
                xs.pop()
                ys.pop()
            ts.append(t)
            xs.append(x)
            ys.append(y)
        return ts, xs, ys, s.n / n

    @staticmethod
    def _pick(xs: list[float], ys: list[float], lam: float) -> int:
        """Index of the hull point maximising hits - lam * space (the first, on ties)."""
        j = 0
        last = len(xs) - 1
        while j < last and ys[j + 1] - ys[j] > lam * (xs[j + 1] - xs[j]):
            j += 1
        return j

    def _demand(self, lam: float, hulls: list[_Hull]) -> float:
        """Block-seconds all classes would hold at price ``lam``, over the lifetimes seen."""
        return sum(xs[self._pick(xs, ys, lam)] * scale for _, xs, ys, scale in hulls)

    def solve(self, lam: float, blocks: float, elapsed_s: float, steps: int = 14,
              span: float = 30.0) -> float:
        """The price near ``lam`` at which the demand fits ``blocks`` cache slots."""
        target = blocks * max(elapsed_s, 1.0)
        parents = self._parents
        hulls = [self._hull(st, parents[self._coarse(c)]) for c, st in self._fine.items()]
        lo, hi = lam / span, lam * span
        for _ in range(steps):
            mid = (lo * hi) ** 0.5
            if self._demand(mid, hulls) > target:
                lo = mid
            else:
                hi = mid
        return hi
