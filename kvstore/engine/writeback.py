"""The engine's durability: the recovery point and the drain.

Under every policy, a block stored in a tier faster than the persistent one (the
disk) is queued for write-back there at its recovery point (``disk.max_write_delay_s``
after its put) unless the policy dropped it meanwhile; a drain (the server's stop)
refuses puts and writes back everything a faster tier holds that the disk does not.
The copies themselves are the placement's (a persistent tier takes a block only
after its prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from kvstore.engine.geometry import Geometry
from kvstore.engine.index import Entry
from kvstore.engine.mover import Transfer
from kvstore.engine.placement import Placement
from kvstore.errors import Unavailable

__all__ = ["WriteBack"]

log = logging.getLogger("kvstore.engine")


class WriteBack:
    """The recovery point and the drain, over the placement primitives."""

    def __init__(self, placement: Placement, geometry: Geometry) -> None:
        self.placement = placement
        #: Block sizes and the cost model per namespace.
        self.geometry = geometry
        #: False once a drain began: puts are refused (UNAVAILABLE).
        self.accepting = True

    def queue_recovery_point(self) -> int:
        """Queue the write-back of every block whose recovery point has come (it was
        stored ``recovery.delay_s`` ago) and that is still only in tiers faster than
        the first persistent one; blocks the policy dropped meanwhile are gone from the
        index. Returns how many were queued."""
        pl = self.placement
        if pl.recovery is None:
            return 0
        dst = self.durable_tier()
        if dst is None:
            return 0
        rank = pl.rank
        n = 0
        for key in pl.recovery.due(pl.clock()):
            entry = pl.index.get(key)
            if entry is None or not entry.tiers or dst in entry.tiers:
                continue
            src = entry.tiers[0]
            if rank(src) < rank(dst) and self.worth_on(key.namespace, dst):
                n += pl.mover.submit(Transfer(key, src, dst, keep_src=True,
                                                reason="recovery point"))
        return n

    def worth_on(self, namespace: str, tier_name: str) -> bool:
        """Whether a load from the tier beats recomputing the namespace's blocks (cost
        model): a copy where it does not is worthless (no lookup serves from it)."""
        return bool(self.geometry.worth(namespace)[self.placement.rank(tier_name)])

    def reachable(self, entry: Entry, memo: dict[int, bool]) -> bool:
        """Whether every ancestor of ``entry`` is still stored (a lookup can reach it);
        ``memo`` (by ``id`` of an entry) shares the walk between calls."""
        index = self.placement.index
        path: list[Entry] = []
        e: Entry | None = entry
        ok = True
        while e is not None:
            known = memo.get(id(e))
            if known is not None:
                ok = known
                break
            path.append(e)
            parent = e.meta.parent_hash
            if parent is None:
                break
            e = index.get_hash(e.key.namespace, parent)
            if e is None or len(path) > len(index):
                ok = False  # an ancestor is stored nowhere (or the chain loops)
                break
        for p in path:
            memo[id(p)] = ok
        return ok

    def durable_tier(self) -> str | None:
        """The fastest persistent tier (the disk), if there is one."""
        pl = self.placement
        return next((name for name in pl.order if name in pl.persistent), None)

    def check_accepting(self) -> None:
        """Refuse a put once the server is draining (it is about to exit)."""
        if not self.accepting:
            raise Unavailable("the server is shutting down (writing DRAM back to disk before "
                              "it exits): put refused; retry after its restart")

    async def drain(self, seconds: float) -> int:
        """Stop taking puts, then write back to the persistent tier every block only
        faster tiers hold (whose prefix is still stored), for at most ``seconds``.
        Returns how many such blocks are left unwritten."""
        self.accepting = False
        dst = self.durable_tier()
        if dst is None:
            return 0
        pl = self.placement
        rank, index = pl.rank, pl.index

        def unwritten() -> list[Entry]:
            reach: dict[int, bool] = {}
            return [e for e in index.entries() if e.tiers and dst not in e.tiers
                    and rank(e.tiers[0]) < rank(dst) and self.worth_on(e.key.namespace, dst)
                    and self.reachable(e, reach)]

        async def write_back(entries: list[Entry]) -> None:
            for entry in entries:  # stored order: parents before children, mostly
                if not entry.tiers or dst in entry.tiers:
                    continue
                src = entry.tiers[0]
                try:
                    await pl.copy(entry, src, dst)
                except Exception as exc:  # counted and warned; the drain goes on
                    pl.health.copy_failed("drain write-back", entry.key, src, dst, exc)

        todo = unwritten()
        t0 = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(write_back(todo), seconds)
        left = len(unwritten())
        log.log(logging.WARNING if left else logging.INFO,
                "drain: %d of %d blocks written back to %s in %.1fs; %d left unwritten",
                len(todo) - left, len(todo), dst, time.monotonic() - t0, left)
        return left
