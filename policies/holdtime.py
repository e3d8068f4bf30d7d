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

    def _best(self, s: _Stats, p: _Stats | None, lam: float) -> tuple[float, float]:
        """(hold time, block-seconds per lifetime started) maximising hits - lam * space."""
        a = self.smoothing / (p.n + 1.0) if p is not None and self.smoothing else 0.0
        n = s.n + self.prior + (a * p.n if a and p is not None else 0.0)
        best = 0.0
        hold = 0.0
        space = 0.0
        hits = 0.0
        gaps = 0.0
        for i, t in enumerate(GRID):
            hits += s.cnt[i]
            gaps += s.total[i]
            if a and p is not None:
                hits += a * p.cnt[i]
                gaps += a * p.total[i]
            sp = gaps + t * max(n - hits, 0.0)
            v = hits - lam * sp
            if v > best:
                best, hold, space = v, t, sp
        return hold, space * s.n / n

    def _hull(self, s: _Stats, p: _Stats) -> tuple[list[float], list[float], float]:
        """The (space, hits) points per lifetime on GRID that can maximise
        hits - lam * space for some lam > 0 (the upper hull from (0, 0)), and s.n / n."""
        a = self.smoothing / (p.n + 1.0) if self.smoothing else 0.0
        n = s.n + self.prior + a * p.n
        xs, ys = [0.0], [0.0]
        hits = gaps = 0.0
        for i, t in enumerate(GRID):
            hits += s.cnt[i] + a * p.cnt[i]
            gaps += s.total[i] + a * p.total[i]
            x, y = gaps + t * max(n - hits, 0.0), hits
            if x <= xs[-1]:
                if y <= ys[-1]:
                    continue
                xs.pop()  # more hits for no more space: dominates the last point
                ys.pop()
                if not xs:
                    xs.append(x)
                    ys.append(y)
                    continue
            while len(xs) >= 2 and ((ys[-1] - ys[-2]) * (x - xs[-1])
                                    <= (y - ys[-1]) * (xs[-1] - xs[-2])):
                xs.pop()
                ys.pop()
            xs.append(x)
            ys.append(y)
        return xs, ys, s.n / n

    def demand(self, lam: float) -> float:
        """Block-seconds all classes would hold at price ``lam``, over the lifetimes seen."""
        return self._demand(self._hulls(), lam)

    def _hulls(self) -> list[tuple[list[float], list[float], float]]:
        parents = self._parents
        coarse = self._coarse
        return [self._hull(s, parents[coarse(c)]) for c, s in self._fine.items()]

    @staticmethod
    def _demand(hulls: list[tuple[list[float], list[float], float]], lam: float) -> float:
        total = 0.0
        for xs, ys, scale in hulls:
            j = 0
            last = len(xs) - 1
            while j < last and ys[j + 1] - ys[j] > lam * (xs[j + 1] - xs[j]):
                j += 1
            total += xs[j] * scale
        return total

    def solve(self, lam: float, blocks: float, elapsed_s: float, steps: int = 14,
              span: float = 30.0) -> float:
        """The price near ``lam`` at which the demand fits ``blocks`` cache slots."""
        target = blocks * max(elapsed_s, 1.0)
        hulls = self._hulls()
        lo, hi = lam / span, lam * span
        for _ in range(steps):
            mid = (lo * hi) ** 0.5
            if self._demand(hulls, mid) > target:
                lo = mid
            else:
                hi = mid
        return hi
