"""Long calls let the event loop go by the time they have held it, not by a count.

A Reserve, Commit or Acquire of many blocks runs on the server's event loop; every
other call (a Lookup on vLLM's scheduler path, a finished transfer's callback) waits
until it lets go. A fixed count of blocks between yields holds the loop for as long as
those blocks happen to cost: 64 blocks were ~0.8 ms of a Reserve and 1.5-3 ms of a
Commit, more on a busy machine. :class:`Pace` yields once ``budget_s`` of wall time has
passed since the last yield, whatever the blocks cost; a call shorter than that never
yields.

Some work must be done just before the loop goes, and grows with what came before
it: a commit places (indexes, and tells the policy, the events and the write-back) the
blocks it committed since its last pause, so no other call sees a committed slot the
index does not hold. Placing costs more than the commit's own loop (measured: ~13 us
against ~8 us a 64 KiB block), so a budget that counted only the loop held it 1.3 ms
for 0.5. Such a caller says how many items are pending; the pace learns what one costs
from each pause's timed ``before`` and counts the pending ones against the budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter

__all__ = ["YIELD_S", "Pace"]

#: The longest a long call holds the event loop between yields, in seconds.
YIELD_S = 0.0005


class Pace:
    """Between the items of a long call: ``if pace.due(): await pace.pause()``, or with
    work pending until the pause, ``if pace.due(n): await pace.pause(flush, n)``.

    ``budget_s``: :data:`YIELD_S` as it is when the call starts."""

    __slots__ = ("budget_s", "per_item", "until", "yields")

    def __init__(self, budget_s: float | None = None) -> None:
        if budget_s is None:
            budget_s = YIELD_S
        if budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        self.budget_s = budget_s
        self.until = perf_counter() + budget_s
        self.yields = 0
        #: seconds one pending item costs at a pause (learned from each timed
        #: ``before``); None until the first one
        self.per_item: float | None = None

    def due(self, pending: int = 0) -> bool:
        """Whether the call has held the loop for ``budget_s`` since it last let go,
        counting the ``pending`` items a pause must finish first. Before any pause
        measured one, pending items make the first budget a quarter (the first pause
        then comes soon, and measures them)."""
        now = perf_counter()
        if not pending:
            return now >= self.until
        if self.per_item is None:
            return now >= self.until - 0.75 * self.budget_s
        return now + pending * self.per_item >= self.until

    async def pause(self, before: Callable[[], object] | None = None, items: int = 0
                    ) -> None:
        """Run ``before`` (the work of ``items`` pending items, timed), let the loop
        run every other ready callback once, then start a new budget."""
        if before is not None:
            start = perf_counter()
            before()
            if items:
                self.per_item = (perf_counter() - start) / items
        await asyncio.sleep(0)
        self.yields += 1
        self.until = perf_counter() + self.budget_s
