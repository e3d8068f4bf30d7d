"""Background transfers: the mover's copies, the policy's moves, write-back.

Part of :class:`~kvstore.engine.placement.Placement`: a queued transfer re-checks the
block's state when it runs (things change while queued) and copies or drops it with the
placement's own primitives (:meth:`Placement.copy`, :meth:`Placement.unlink`), which stay
in :mod:`kvstore.engine.placement`, which this module must not import.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Hashable, Sequence
from typing import TYPE_CHECKING

from kvstore.engine.mover import Mover, Transfer
from kvstore.policies import Move
from kvstore.types import BlockKey

if TYPE_CHECKING:
    from kvstore.engine.durability import RecoveryPoint, WriteHealth
    from kvstore.engine.eviction import EvictionManager
    from kvstore.engine.index import Entry, Index
    from kvstore.engine.leases import Leases
    from kvstore.engine.observe import SharedHooks
    from kvstore.engine.retention import Retention

__all__ = ["Transfers"]


class Transfers:
    """The background-transfer half of :class:`~kvstore.engine.placement.Placement`."""

    if TYPE_CHECKING:
        # What this part reads of the placement (set in Placement.__init__).
        index: Index
        policy: EvictionManager
        clock: Callable[[], float]
        retention: Retention
        leases: Leases
        health: WriteHealth
        mover: Mover
        shared: SharedHooks | None
        write_back: bool
        recovery: RecoveryPoint | None
        _rank: dict[str, int]
        _persistent: set[str]
        _in_flight: Counter[BlockKey]

        async def copy(self, entry: Entry, src: str, dst: str,
                       extra: Container[Hashable] = ()) -> None: ...
        async def _drop(self, key: BlockKey, tier_name: str) -> None: ...

    # -- background transfers -------------------------------------------------------------
    async def run_transfer(self, t: Transfer) -> None:
        """Execute one mover transfer, re-checking state (things change while queued)."""
        entry = self.index.get(t.key)
        if entry is None or t.src not in entry.tiers:
            return
        if t.key in self._in_flight:
            return  # already being copied (a demotion or promotion does the same work)
        if not t.keep_src and t.key in self.leases.pins:
            return  # being read: a move away would pull it from under the reader
        if t.dst is not None and t.dst not in entry.tiers:
            try:
                await self.copy(entry, t.src, t.dst, t.protect)
            except Exception as exc:  # counted here by cause; the mover warns and counts it
                self.health.copy_failed(t.reason, t.key, t.src, t.dst, exc, warn=False)
                raise
        if not t.keep_src and self.index.get(t.key) is not None:
            await self._drop(t.key, t.src)

    def schedule(self, moves: Sequence[Move], reason: str) -> int:
        """Queue the policy's moves. A drop (``dst=None``) drops every copy: with
        write-back a block may sit in several tiers, and the policy sees the fastest.
        A move up (a prefetch) keeps the slower copy, as write-back would make it."""
        n = 0
        rank = self._rank
        now = self.clock()
        for m in moves:
            if not isinstance(m.key, BlockKey):
                continue
            if m.dst is None and self.retention.active(m.key, now):
                continue  # retained: the policy's drop waits for the deadline
            entry = self.index.get(m.key)
            srcs = list(entry.tiers) if (m.dst is None and entry is not None) else [m.src]
            for src in srcs:
                up = m.dst is not None and rank.get(m.dst, len(rank)) < rank.get(src, -1)
                n += self.mover.submit(Transfer(m.key, src, m.dst, keep_src=up, reason=reason))
        return n

    def after_store(self, entry: Entry) -> None:
        """Write-back: queue a copy of a new block where the policy would demote it
        (the next slower tier by default), so an eviction later is a drop; and the
        write-through to a shared tier, if there is one."""
        self.after_store_many((entry,))

    def after_store_many(self, entries: Sequence[Entry]) -> None:
        """:meth:`after_store` of each of ``entries``, in order."""
        shared, recovery, persistent = self.shared, self.recovery, self._persistent
        demote = self.policy.demote_to if self.write_back else None
        submit = self.mover.submit
        now = self.clock()
        for entry in entries:
            if shared is not None:
                shared.after_store(entry)
            src, key = entry.tiers[0], entry.key
            if demote is not None:
                dst = demote(key, src, now)
                if dst is not None:
                    submit(Transfer(key, src, dst, keep_src=True, reason="write-back"))
            if recovery is not None and src not in persistent:
                recovery.stored(key, now)
