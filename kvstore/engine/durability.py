"""What the engine keeps to make its durability promises, and to say when it cannot.

* :class:`RecoveryPoint`: every block stored in a fast tier, due for write-back to
  the persistent tier by a deadline (``disk.max_write_delay_s`` after its put),
  whatever the policy's own write-back decided. The engine queues the copies
  that are due; blocks the policy dropped meanwhile are simply gone from the index.
* :class:`WriteHealth`: failed copies between tiers (demotions, write-backs),
  counted per (source, destination, cause); and writes into each tier that failed
  for want of the tier itself (an I/O error, a tier down), counted in a row: a
  tier whose last ``threshold`` writes all failed so is *degraded* until one of
  its writes succeeds again (room refusals count neither way).
* :func:`cause_of`: the cause label of a failed write.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Iterator

from kvstore.errors import DataCorruption, ResourceExhausted, Unavailable
from kvstore.types import BlockKey

__all__ = ["RecoveryPoint", "WriteHealth", "cause_of"]

log = logging.getLogger("kvstore.engine")


def cause_of(exc: BaseException) -> str:
    """``no_room`` (the destination is full of what cannot go: normal under
    saturation), ``unavailable`` (an I/O error, a tier down), ``corrupt`` (the
    source's bytes failed their checksum), or ``error`` (anything else)."""
    if isinstance(exc, ResourceExhausted):
        return "no_room"
    if isinstance(exc, (Unavailable, OSError)):
        return "unavailable"
    if isinstance(exc, DataCorruption):
        return "corrupt"
    return "error"


class RecoveryPoint:
    """Blocks in the order they were stored, each with the time its write-back is due.

    One delay for all, so the deadlines come in order and a deque is enough."""

    __slots__ = ("_due", "delay_s")

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._due: deque[tuple[float, BlockKey]] = deque()

    def stored(self, key: BlockKey, now: float) -> None:
        self._due.append((now + self.delay_s, key))

    def due(self, now: float) -> Iterator[BlockKey]:
        """The keys whose deadline has come, oldest first (each given out once)."""
        due = self._due
        while due and due[0][0] <= now:
            yield due.popleft()[1]

    def __len__(self) -> int:
        return len(self._due)


class WriteHealth:
    """Failed writes per tier, and whether a tier is degraded (see the module doc)."""

    def __init__(self, threshold: int = 5, warn_every_s: float = 10.0) -> None:
        #: Failures in a row (no success between) that make a tier degraded.
        self.threshold = threshold
        self.warn_every_s = warn_every_s
        #: (src, dst, cause) -> failed copies (all of them), and of those the demotions
        self.failed: Counter[tuple[str, str, str]] = Counter()
        self.demotions: Counter[tuple[str, str, str]] = Counter()
        #: dst -> writes failed (tier unavailable) since its last successful write
        self._in_a_row: Counter[str] = Counter()
        self._warned_at = -1e18
        self._unwarned = 0

    def ok(self, dst: str) -> None:
        """A write into ``dst`` succeeded: it is healthy again."""
        if self._in_a_row[dst]:
            log.warning("tier %s: a write succeeded after %d failures in a row", dst,
                        self._in_a_row[dst])
            del self._in_a_row[dst]

    def write_failed(self, dst: str) -> None:
        """A write into ``dst`` failed for want of the tier itself (I/O error, down)."""
        self._in_a_row[dst] += 1

    def copy_failed(self, what: str, key: BlockKey, src: str, dst: str, exc: BaseException,
                    *, warn: bool = True, demotion: bool = False) -> str:
        """Count a failed copy of ``key`` from ``src`` into ``dst`` (a demotion, a
        write-back) by cause; warn, at most once per ``warn_every_s`` with the count of
        those not warned about. Returns the cause."""
        cause = cause_of(exc)
        self.failed[(src, dst, cause)] += 1
        if demotion:
            self.demotions[(src, dst, cause)] += 1
        if not warn:
            return cause
        now = time.monotonic()
        if now - self._warned_at < self.warn_every_s:
            self._unwarned += 1
            return cause
        more = (f" ({self._unwarned} more failed copies since the last warning)"
                if self._unwarned else "")
        log.warning("%s of %s from %s to %s failed (%s): %s%s", what, key, src, dst, cause,
                    exc, more)
        self._warned_at = now
        self._unwarned = 0
        return cause

    def degraded(self) -> list[str]:
        """Tiers whose last ``threshold`` writes (or more) all failed."""
        return sorted(t for t, n in self._in_a_row.items() if n >= self.threshold)
