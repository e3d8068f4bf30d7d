"""The disk tier's first operation: recovery builds the index, once per instance.

Part of :class:`~kvstore.tiers.disk.tier.DiskTier` (its
:class:`~kvstore.tiers.base.PersistentTier` side): the first call of any operation
runs :func:`~kvstore.tiers.disk.recover.recover_root` (footers and kill lists, a scan
only of a segment without a footer) and loads its report into the tier's index and
segment map; later :meth:`Startup.recover` calls read the footers again.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvstore.errors import TierUnavailable
from kvstore.tiers.disk.format import Footer
from kvstore.tiers.disk.index import load_footers
from kvstore.tiers.disk.log import Segment
from kvstore.tiers.disk.recover import RecoveryReport, recover_root
from kvstore.types import BlockMeta

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from kvstore.tiers.disk.compact import Compactor
    from kvstore.tiers.disk.index import KeyTable
    from kvstore.tiers.disk.log import GroupWriter

__all__ = ["Startup"]

#: The tier's own logger (its messages kept their name through the split).
log = logging.getLogger("kvstore.tiers.disk.tier")


class Startup:
    """The recovery half of :class:`~kvstore.tiers.disk.tier.DiskTier`."""

    if TYPE_CHECKING:
        # What this part reads of the tier (set in DiskTier.__init__).
        name: str
        root: Path
        skipped: int
        damaged: int
        report: RecoveryReport | None
        _direct: bool
        _sync: bool
        _reads: ThreadPoolExecutor | None
        _recovered: bool
        _recover_lock: asyncio.Lock
        _keys: KeyTable
        _map: dict[int, int]
        _segments: dict[int, Segment]
        _used: int
        _writer: GroupWriter
        _compactor: Compactor

        async def _run(self, fn: Any, *args: object) -> Any: ...
        def _kill(self, loc: int) -> asyncio.Future[None]: ...
        def _on_sealed(self, seg: Segment) -> None: ...

    # ---- PersistentTier -----------------------------------------------------------
    async def recover(self) -> list[BlockMeta]:
        """Metadata of every stored block. The first call (once per instance; any
        operation makes it) reads the segments' footers and kill lists and builds
        the index; later calls read the footers again."""
        metas = await self._recover_once()
        return metas if metas is not None else await self._compactor.list_metas()

    async def _recover_once(self) -> list[BlockMeta] | None:
        """Build the index unless it is built; the metas when this call built it."""
        async with self._recover_lock:
            if self._reads is None:
                raise TierUnavailable(f"tier {self.name!r} is closed")
            if self._recovered:
                return None
            # Recovery makes millions of objects that live on: the cyclic GC would
            # rescan the growing heap again and again while they are built.
            frozen = gc.isenabled()
            gc.disable()
            try:
                report = await self._run(recover_root, self.root, self._direct, self._sync)
                metas = self._load(report)
            finally:
                if frozen:
                    gc.enable()
            self._recovered = True
            return metas

    def _load(self, report: RecoveryReport) -> list[BlockMeta]:
        self.skipped += len(report.skipped)
        self.damaged += report.damaged + report.torn
        loaded = load_footers(report, self._keys, self._map)
        for rs in report.segments:
            seg = Segment(rs.file, rs.file.size, sealed=True, footer=rs.has_footer,
                          kills=rs.kills)
            seg.live_count, seg.live_bytes = loaded.live[seg.seg_id]
            self._segments[seg.seg_id] = seg
        self._used = loaded.used
        for prev in loaded.superseded:  # older records of a key: dead now
            self._kill(prev)
        self._writer.next_id = report.next_id
        for seg in list(self._segments.values()):
            self._on_sealed(seg)
        for rs in report.segments:  # the footers' entries are not needed any more
            rs.footer = Footer([], [])
            rs.killed = set()
        self.report = report
        log.info("tier %r: %d blocks in %d segments recovered in %.2fs (%d scanned, %d entries "
                 "skipped, %d damaged records dropped)", self.name, len(self._map),
                 len(self._segments), report.seconds, report.scanned, len(report.skipped),
                 report.damaged + report.torn)
        return loaded.metas

    async def _ready(self) -> None:
        if self._reads is None:
            raise TierUnavailable(f"tier {self.name!r} is closed")
        if not self._recovered:
            await self._recover_once()
