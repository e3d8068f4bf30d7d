"""Session return times after a turn event, learned online per class.

The workload policy keys this by (workload, event or tool): when a hint says a
session is waiting on a user or a tool, and the session then comes back, the
gap goes into a histogram over half-octave bins of seconds. ``median_gap``
answers "how long does a session usually wait after this event", which decides
whether its blocks are offloaded between turns when the hint gives no
``expected_gap_ms`` of its own.
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


class ReturnModel:
    """Per-class histograms of return gaps."""

    __slots__ = ("_classes",)

    def __init__(self) -> None:
        self._classes: dict[Hashable, list[int]] = {}

    def returned(self, cls: Hashable, gap_s: float) -> None:
        hist = self._classes.get(cls)
        if hist is None:
            hist = self._classes[cls] = [0] * _BINS
        hist[gap_bin(gap_s)] += 1

    def median_gap(self, cls: Hashable) -> float | None:
        """Median observed return gap of ``cls`` in seconds (bin upper edge), None before
        any return."""
        hist = self._classes.get(cls)
        if hist is None:
            return None
        half = sum(hist) / 2.0
        acc = 0
        for b, count in enumerate(hist):
            acc += count
            if acc >= half:
                return bin_upper(b)
        return None
