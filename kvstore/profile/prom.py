"""Prometheus gauges of the live profile's headline numbers (read at scrape time).

``kvstore_profile_*``: requests in the window, requests per minute, peak to
trough, burstiness, unbounded-cache hit rate, sessions; input / output tokens,
calls per session, tokens read back and gap seconds (per ``after`` kind) as
``quantile`` 0.5 / 0.9 / 0.99; requests per quadrant.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvstore.profile.dist import Dist
from kvstore.profile.live import LiveProfile

__all__ = ["ProfileCollector"]

_QUANTILES = (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"))


def _quantiles(name: str, doc: str, d: Dist | None) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["quantile"])
    if d is not None:
        for label, attr in _QUANTILES:
            g.add_metric([label], getattr(d, attr))
    return g


class ProfileCollector(Collector):
    def __init__(self, profile: LiveProfile) -> None:
        self.profile = profile

    def collect(self) -> Iterator[Any]:
        p = self.profile.snapshot()
        a = p.arrival
        yield GaugeMetricFamily("kvstore_profile_window_requests",
                                "Requests in the live profile's window", value=p.requests)
        yield GaugeMetricFamily("kvstore_profile_requests_per_minute",
                                "Mean arrival rate over the window", value=a.requests_per_minute)
        if a.peak_to_trough is not None:
            yield GaugeMetricFamily("kvstore_profile_peak_to_trough",
                                    "Busiest over quietest complete bin (requests)",
                                    value=a.peak_to_trough)
        if a.interarrival_cv is not None:
            yield GaugeMetricFamily("kvstore_profile_burstiness",
                                    "Coefficient of variation of inter-arrival times",
                                    value=a.interarrival_cv)
        if p.reuse is not None:
            yield GaugeMetricFamily("kvstore_profile_unbounded_hit_rate",
                                    "Prefix hit rate of an unbounded cache, per block",
                                    value=p.reuse.unbounded_hit_rate)
        yield _quantiles("kvstore_profile_input_tokens", "Input tokens per request",
                         p.lengths.input_tokens)
        yield _quantiles("kvstore_profile_output_tokens", "Output tokens per request (hints)",
                         p.lengths.output_tokens)
        quads = GaugeMetricFamily("kvstore_profile_quadrant_requests",
                                  "Requests per (input, output) quadrant", labels=["quadrant"])
        for q, n in p.lengths.quadrants.items():
            quads.add_metric([q], n)
        yield quads
        s = p.sessions
        yield GaugeMetricFamily("kvstore_profile_sessions", "Sessions in the window",
                                value=0 if s is None else s.sessions)
        yield _quantiles("kvstore_profile_calls_per_session", "Calls per session",
                         None if s is None else s.calls_per_session)
        yield _quantiles("kvstore_profile_read_back_tokens",
                         "Tokens an unbounded cache serves per call after a session's first",
                         None if s is None else s.read_back_tokens)
        gaps = GaugeMetricFamily("kvstore_profile_gap_seconds",
                                 "Gap to a session's next call, by what followed the call",
                                 labels=["after", "quantile"])
        for kind, d in ({} if s is None else s.gaps_s).items():
            for label, attr in _QUANTILES:
                gaps.add_metric([kind, label], getattr(d, attr))
        yield gaps
