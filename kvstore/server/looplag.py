"""The event loop's lag: how late a timer due every few milliseconds runs.

Every call the server answers waits for the loop; work done on the loop (hashing,
copying, page faults, a long Python walk) shows up here as lag for everyone. The
monitor keeps the last samples with their times, and the Stats RPC summarises a
window of them (``kvstore bench`` reads it under a save storm).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

__all__ = ["LagSummary", "LoopLag"]


@dataclass(frozen=True, slots=True)
class LagSummary:
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float


class LoopLag:
    """Sample the running loop's lag every ``interval_s`` (keeps ``keep`` samples)."""

    def __init__(self, interval_s: float = 0.005, keep: int = 20_000) -> None:
        self.interval_s = interval_s
        #: (monotonic time of the sample, lag in seconds)
        self._samples: deque[tuple[float, float]] = deque(maxlen=keep)

    async def run(self) -> None:
        interval = self.interval_s
        while True:
            due = time.monotonic() + interval
            await asyncio.sleep(interval)
            now = time.monotonic()
            self._samples.append((now, max(0.0, now - due)))

    def summary(self, window_s: float = 10.0, now: float | None = None) -> LagSummary:
        """The lag over the last ``window_s`` seconds."""
        since = (time.monotonic() if now is None else now) - window_s
        lags = sorted(lag for t, lag in self._samples if t >= since)
        if not lags:
            return LagSummary(0, 0.0, 0.0, 0.0)
        n = len(lags)
        return LagSummary(n, lags[n // 2] * 1e3, lags[min(n - 1, int(n * 0.99))] * 1e3,
                          lags[-1] * 1e3)
