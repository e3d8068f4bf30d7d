"""Return-time distributions learned online, one per class of block.

A *lifetime* starts when a block is used (stored or looked up) and ends when
its key is looked up again; its length is the return gap. Per class we count
lifetimes started and a histogram of return gaps over half-octave bins of
seconds. From these, ``p_return(cls, age, window)`` estimates the chance that
a block of that class, idle for ``age`` seconds, is back within ``window``
more seconds: the returns in ``[age, age + window]`` over the lifetimes that
have survived to ``age``. Lifetimes that never return stay in the
denominator, so classes whose blocks never come back score near zero.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

__all__ = ["ReturnModel"]

_BINS = 48  # half-octaves from 1 s: the last bin starts near 2**23.5 s (> 100 days)


def gap_bin(seconds: float) -> int:
    if seconds <= 1.0:
        return 0
    return min(_BINS - 1, int(2.0 * math.log2(seconds)))


def bin_upper(b: int) -> float:
    return 2.0 ** ((b + 1) / 2.0)


_MID = [2.0 ** ((b + 0.5) / 2.0) for b in range(_BINS)]
_MID[0] = 0.5


class _Class:
    __slots__ = ("cum", "cum_t", "dirty", "hist", "started")

    def __init__(self) -> None:
        self.started = 0
        self.hist = [0] * _BINS
        self.cum = [0] * (_BINS + 1)
        self.cum_t = [0.0] * (_BINS + 1)
        self.dirty = False

    def cumulative(self) -> list[int]:
        if self.dirty:
            c = self.cum
            ct = self.cum_t
            acc = 0
            acc_t = 0.0
            for i, v in enumerate(self.hist):
                c[i] = acc
                ct[i] = acc_t
                acc += v
                acc_t += v * _MID[i]
            c[_BINS] = acc
            ct[_BINS] = acc_t
            self.dirty = False
        return self.cum


class ReturnModel:
    """Per-class lifetime counts and return-gap histograms."""

    __slots__ = ("_classes", "prior_p")

    def __init__(self, prior_p: float = 0.1) -> None:
        self._classes: dict[Hashable, _Class] = {}
        self.prior_p = prior_p

    def _get(self, cls: Hashable) -> _Class:
        c = self._classes.get(cls)
        if c is None:
            c = self._classes[cls] = _Class()
        return c

    def start(self, cls: Hashable) -> None:
        self._get(cls).started += 1

    def unstart(self, cls: Hashable) -> None:
        c = self._get(cls)
        c.started = max(0, c.started - 1)

    def returned(self, cls: Hashable, gap_s: float) -> None:
        c = self._get(cls)
        c.hist[gap_bin(gap_s)] += 1
        c.dirty = True

    def observations(self, cls: Hashable) -> tuple[int, int]:
        """(lifetimes started, returns seen) for ``cls``."""
        c = self._classes.get(cls)
        if c is None:
            return 0, 0
        return c.started, c.cumulative()[_BINS]

    def p_return(self, cls: Hashable, age: float, window: float) -> float:
        c = self._classes.get(cls)
        if c is None:
            return self.prior_p
        cum = c.cumulative()
        lo = gap_bin(age)
        hi = gap_bin(age + window) + 1
        alive = c.started - cum[lo]
        back = cum[hi] - cum[lo]
        # A weak prior keeps new classes from scoring exactly 0 or 1.
        return (back + self.prior_p) / (max(alive, back) + 1.0)

    def density(self, cls: Hashable, age: float, window: float) -> float:
        """Expected returns per second of cache time (LHD's hit density): the
        chance of a return within ``window`` over the expected time the block
        still occupies the cache (until it returns, or ``window`` if it does not)."""
        c = self._classes.get(cls)
        if c is None:
            return self.prior_p / max(window, 1.0)
        cum = c.cumulative()
        lo = gap_bin(age)
        hi = gap_bin(age + window) + 1
        alive = max(c.started - cum[lo], cum[hi] - cum[lo]) + 1.0
        back = cum[hi] - cum[lo]
        p = (back + self.prior_p) / alive
        wait = (c.cum_t[hi] - c.cum_t[lo]) - back * age
        rem = max(wait, 0.0) / alive + (1.0 - back / alive) * window
        return p / max(rem, 1.0)

    def median_gap(self, cls: Hashable) -> float | None:
        """Median observed return gap of ``cls`` in seconds, None before any return."""
        c = self._classes.get(cls)
        if c is None:
            return None
        cum = c.cumulative()
        total = cum[_BINS]
        if total == 0:
            return None
        half = total / 2.0
        for b in range(_BINS):
            if cum[b + 1] >= half:
                return bin_upper(b)
        return bin_upper(_BINS - 1)
