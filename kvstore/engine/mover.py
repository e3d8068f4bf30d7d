"""The mover: one background task that runs transfers between tiers.

Placement decisions (write-back copies, offloads, drops, prefetches) are queued
here so that requests never wait on a slow tier; the engine does the actual
transfer in :meth:`Engine.run_transfer`. Failures are logged and counted, never
raised into a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Container, Hashable
from dataclasses import dataclass

from kvstore.errors import ResourceExhausted
from kvstore.types import BlockKey

__all__ = ["Mover", "Transfer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Transfer:
    """Copy ``key`` from ``src`` to ``dst``; drop it from ``src`` unless ``keep_src``.
    ``dst=None`` is a plain drop from ``src``."""

    key: BlockKey
    src: str
    dst: str | None
    keep_src: bool = False
    reason: str = ""
    #: Keys the copy must not evict to make room (a prefetch: its request's blocks).
    protect: Container[Hashable] = ()


class Mover:
    def __init__(self, run: Callable[[Transfer], Awaitable[None]], max_queue: int = 100_000):
        self._run = run
        self._queue: asyncio.Queue[Transfer] = asyncio.Queue(max_queue)
        self._task: asyncio.Task[None] | None = None
        self.failed = 0
        self.done = 0
        self.dropped = 0
        self._running = 0
        self.warn_every_s = 10.0
        self._warned_at = -1e9
        self._unwarned = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="kvstore-mover")

    def submit(self, transfer: Transfer) -> bool:
        try:
            self._queue.put_nowait(transfer)
            return True
        except asyncio.QueueFull:
            self.dropped += 1
            return False

    @property
    def pending(self) -> int:
        """Transfers queued or running."""
        return self._queue.qsize() + self._running

    async def drain(self) -> None:
        """Wait until every queued transfer has run (tests, shutdown)."""
        await self._queue.join()

    async def _loop(self) -> None:
        while True:
            t = await self._queue.get()
            await self._run_one(t)

    async def run_pending(self) -> int:
        """Run every queued transfer (and those they queue) in the caller's task, in
        order; returns how many ran. For tests and the trace replay, which drive
        the engine without a background task."""
        n = 0
        while not self._queue.empty():
            await self._run_one(self._queue.get_nowait())
            n += 1
        return n

    async def _run_one(self, t: Transfer) -> None:
        self._running = 1
        try:
            await self._run(t)
            self.done += 1
        except asyncio.CancelledError:
            raise
        except ResourceExhausted as exc:  # no room now: a cache may skip a copy
            self.failed += 1
            log.debug("transfer %s %s->%s (%s) skipped: %s", t.key, t.src, t.dst, t.reason,
                      exc)
        except Exception as exc:  # a failed transfer must not stop the mover
            self.failed += 1
            self._warn(t, exc)
        finally:
            self._running = 0
            self._queue.task_done()

    def _warn(self, t: Transfer, exc: Exception) -> None:
        """At most one warning per ``warn_every_s``, with the count of the others."""
        now = time.monotonic()
        if now - self._warned_at < self.warn_every_s:
            self._unwarned += 1
            return
        more = f" ({self._unwarned} more failures since the last warning)" if self._unwarned else ""
        log.warning("transfer %s %s->%s (%s) failed: %s%s", t.key, t.src, t.dst, t.reason,
                    exc, more)
        self._warned_at = now
        self._unwarned = 0

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
