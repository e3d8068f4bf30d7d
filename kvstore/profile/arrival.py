"""Arrival pattern: requests per minute, peak-to-trough ratio, burstiness.

Bins start at the first request and only complete bins count (a partial last
bin would look like a trough). Peak and trough are counted in hourly bins when
the trace spans at least :data:`MIN_HOURS` complete hours (daily peaks), else in
minute bins (a one-hour trace has no hourly shape to show); ``bin_s`` chooses.
Burstiness is the coefficient of variation of the inter-arrival times: 1 for
Poisson arrivals, above 1 bursty, below 1 regular.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvstore.profile.dist import Dist, cv
from kvstore.profile.model import Arrival

__all__ = ["MIN_HOURS", "arrival_stats", "bin_counts", "default_bin_s"]

MIN_HOURS = 3


def default_bin_s(span_s: float) -> float:
    return 3600.0 if span_s >= MIN_HOURS * 3600.0 else 60.0


def bin_counts(times_s: Sequence[float], bin_s: float) -> list[int]:
    """Requests in each complete ``bin_s`` bin from the first request (sorted times)."""
    if bin_s <= 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s}")
    if not times_s:
        return []
    t0 = times_s[0]
    n = math.floor((times_s[-1] - t0) / bin_s)
    counts = [0] * n
    for t in times_s:
        i = math.floor((t - t0) / bin_s)
        if i < n:
            counts[i] += 1
    return counts


def arrival_stats(times_s: Sequence[float], bin_s: float | None = None) -> Arrival:
    """``times_s``: arrival times in seconds, sorted."""
    span = times_s[-1] - times_s[0] if times_s else 0.0
    width = default_bin_s(span) if bin_s is None else bin_s
    bins = bin_counts(times_s, width)
    peak = max(bins, default=0)
    trough = min(bins, default=0)
    gaps = [b - a for a, b in zip(times_s, times_s[1:], strict=False)]
    return Arrival(
        span_s=span,
        requests_per_minute=60.0 * len(times_s) / span if span > 0 else 0.0,
        per_minute=Dist.of(bin_counts(times_s, 60.0)),
        bin_s=width,
        bins=len(bins),
        peak=peak,
        trough=trough,
        peak_to_trough=peak / trough if len(bins) >= 2 and trough > 0 else None,
        interarrival_cv=cv(gaps),
    )
