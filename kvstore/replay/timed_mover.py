"""The engine's mover on the replay's virtual clock: transfers take time.

The server's mover runs transfers as fast as the tiers allow in a background
task; the offline replay used to run its whole queue between requests, so a
prefetch or a write-back was done before the next request looked. This mover
keeps the same queue (in submission order, one transfer at a time, as the
server's single mover task does) but a transfer completes only when the virtual
clock has passed its start plus ``block_bytes / bandwidth`` of the slower of its
two tiers (the one cost table, :func:`~kvstore.policies.cost.read_bytes_per_s`);
a drop takes no time. Until then the block is where it was: a lookup in the
meantime finds it in its old tier, and a load is priced there.

Limit: the engine's own synchronous copies (a store that spills a run to the next
tier, room made by demotion inside a put) do not go through the mover and stay
instant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

from kvstore.engine.mover import Mover, Transfer
from kvstore.policies.cost import read_bytes_per_s

__all__ = ["TimedMover"]


class TimedMover(Mover):
    """A :class:`Mover` whose queue :meth:`run_until` drains on a virtual clock."""

    def __init__(self, run: Callable[[Transfer], Awaitable[None]], clock: Callable[[], float],
                 set_clock: Callable[[float], None], block_bytes: int,
                 bandwidth: Callable[[str], float] = read_bytes_per_s) -> None:
        super().__init__(run)
        self._clock = clock
        self._set_clock = set_clock
        self._block_bytes = block_bytes
        self._bw = bandwidth
        self._timed: deque[tuple[float, Transfer]] = deque()
        self._busy_until = 0.0
        #: Seconds the mover spent moving bytes (the sum of completed transfers).
        self.busy_s = 0.0

    def submit(self, transfer: Transfer) -> bool:
        self._timed.append((self._clock(), transfer))
        return True

    @property
    def pending(self) -> int:
        return len(self._timed)

    def duration_s(self, t: Transfer) -> float:
        if t.dst is None:
            return 0.0
        return self._block_bytes / min(self._bw(t.src), self._bw(t.dst))

    async def run_until(self, now: float) -> int:
        """Complete, in order, the transfers that finish by ``now``; each runs with the
        clock at its completion time. Returns how many ran."""
        n = 0
        timed = self._timed
        while timed:
            submitted, t = timed[0]
            end = max(self._busy_until, submitted) + self.duration_s(t)
            if end > now:
                break
            timed.popleft()
            self._busy_until = end
            self.busy_s += self.duration_s(t)
            self._set_clock(end)
            try:
                await self._run_one_timed(t)
            finally:
                self._set_clock(now)
            n += 1
        return n

    async def _run_one_timed(self, t: Transfer) -> None:
        # The base class's _run_one pairs each run with its asyncio queue; ours has none.
        self._queue.put_nowait(t)
        await self._run_one(self._queue.get_nowait())

    async def run_pending(self) -> int:
        """Everything queued, now (what the untimed replay did between requests)."""
        n = 0
        while self._timed:
            _, t = self._timed.popleft()
            await self._run_one_timed(t)
            n += 1
        return n

    async def drain(self) -> None:
        await self.run_pending()
