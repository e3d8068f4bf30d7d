"""Long calls let the event loop go by the time they have held it, not by a count.

A Reserve, Commit or Acquire of many blocks runs on the server's event loop; every
other call (a Lookup on vLLM's scheduler path, a finished transfer's callback) waits
until it lets go. A fixed count of blocks between yields holds the loop for as long as
those blocks happen to cost: 64 blocks were ~0.8 ms of a Reserve and 1.5-3 ms of a
Commit (its blocks are placed in a batch just before each yield), and more on a busy
machine. :class:`Pace` yields once ``budget_s`` of wall time has passed since the last
yield, whatever the blocks cost; a call shorter than that never yields.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

__all__ = ["YIELD_S", "Pace"]

#: The longest a long call holds the event loop between yields, in seconds.
YIELD_S = 0.0005


class Pace:
    """``if pace.due(): await pace.pause()`` between the blocks of a long call
    (``budget_s``: :data:`YIELD_S` as it is when the call starts)."""

    __slots__ = ("budget_s", "until", "yields")

    def __init__(self, budget_s: float | None = None) -> None:
        if budget_s is None:
            budget_s = YIELD_S
        if budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        self.budget_s = budget_s
        self.until = perf_counter() + budget_s
        self.yields = 0

    def due(self) -> bool:
        """Whether the call has held the loop for ``budget_s`` since it last let go."""
        return perf_counter() >= self.until

    async def pause(self) -> None:
        """Let the loop run every other ready callback once, then start a new budget."""
        await asyncio.sleep(0)
        self.yields += 1
        self.until = perf_counter() + self.budget_s
