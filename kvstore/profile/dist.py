"""Distributions: count, mean, p50 / p90 / p99, min, max of a list of numbers.

Percentiles interpolate linearly between the two nearest ranks (numpy's default
``linear`` method), so a test can check them against ``numpy.percentile``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Dist", "cv", "percentile"]


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of an already sorted, non-empty sequence."""
    if not ordered:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    return float(ordered[lo]) + (float(ordered[hi]) - float(ordered[lo])) * frac


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation (population standard deviation / mean); None when
    there are fewer than two values or the mean is 0. 1.0 is a Poisson process."""
    if len(values) < 2:
        return None
    mean = math.fsum(values) / len(values)
    if mean <= 0:
        return None
    var = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return math.sqrt(var) / mean


@dataclass(frozen=True, slots=True)
class Dist:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Dist | None:
        """The distribution of ``values``; None when there are none."""
        ordered = sorted(values)
        if not ordered:
            return None
        return cls(len(ordered), math.fsum(ordered) / len(ordered), percentile(ordered, 50),
                   percentile(ordered, 90), percentile(ordered, 99), float(ordered[0]),
                   float(ordered[-1]))

    def to_json(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p90": self.p90,
                "p99": self.p99, "min": self.min, "max": self.max}

