"""Space reclaim of the disk tier: kill lists, hole punching, segment removal, compaction.

* :class:`Killer` records that a record is dead (deleted, replaced, found
  corrupt): the record's offset goes into its segment's kill list, which is
  synced (restart then never brings it back), and the record's bytes are
  punched out of the file so its space is free at once. Kills queued together
  share one sync. A sealed segment without live records is removed.
* :class:`Compactor` rewrites the live records of a sealed segment that is
  mostly dead (less than a quarter live) through the group commit, so the
  segment can go: it bounds the number of files and, on filesystems that
  cannot punch holes, the dead space. A rewritten record is committed only if
  its block still sits where it was read from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

from kvstore.tiers.disk.format import BadSegment, entry_meta
from kvstore.tiers.disk.index import offset_of, record_len_of, seg_of
from kvstore.tiers.disk.log import Segment, Write
from kvstore.tiers.disk.segment import SegmentFile, punch, read_footer, remove_segment, write_kills
from kvstore.types import BlockKey, BlockMeta

if TYPE_CHECKING:
    from kvstore.tiers.disk.tier import DiskTier

__all__ = ["Compactor", "Killer"]

log = logging.getLogger(__name__)


class Killer:
    def __init__(self, root: Path, executor: Executor, segments: dict[int, Segment],
                 sync: bool, *, on_empty: Callable[[Segment], None],
                 on_sparse: Callable[[Segment], None]):
        self.root = root
        self._executor = executor
        self._segments = segments
        self._sync = sync
        self._on_empty = on_empty
        self._on_sparse = on_sparse
        self._queue: dict[int, list[tuple[int, asyncio.Future[None]]]] = {}
        self._removals: list[Segment] = []
        self._task: asyncio.Task[None] | None = None
        self.can_punch = True
        self.punched_bytes = 0

    def kill(self, seg: Segment, loc: int, *, counted: bool) -> asyncio.Future[None]:
        """Queue the kill of the record at ``loc``; the future is done once it is durable.
        ``counted``: the record was live in ``seg``'s counts (it is taken out of them)."""
        if counted:
            seg.live_count -= 1
            seg.live_bytes -= record_len_of(loc)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.setdefault(seg.seg_id, []).append((loc, fut))
        self._start()
        return fut

    def maybe_remove(self, seg: Segment) -> None:
        """Remove ``seg`` once it is sealed, footed and holds no live record."""
        if _removable(seg):
            self._removals.append(seg)
            self._start()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue or self._removals:
            batch, self._queue = self._queue, {}
            for seg_id in sorted(batch):  # older segments first: a replaced record dies first
                items = batch[seg_id]
                seg = self._segments.get(seg_id)
                if seg is not None and not seg.removed:
                    await self._write(loop, seg, items)
                for _, fut in items:
                    if not fut.done():
                        fut.set_result(None)
                if seg is not None and not seg.removed:
                    if _removable(seg):
                        self._removals.append(seg)
                    elif seg.sealed and seg.live_count:
                        self._on_sparse(seg)
            removals, self._removals = self._removals, []
            for seg in removals:
                if _removable(seg):
                    seg.compacting = True  # nothing else starts on it while its files go
                    try:
                        await loop.run_in_executor(self._executor, remove_segment, self.root,
                                                   seg.seg_id)
                    except OSError as exc:
                        log.warning("disk tier: segment %016x not removed: %s", seg.seg_id, exc)
                        seg.compacting = False
                        continue
                    self._on_empty(seg)

    async def _write(self, loop: asyncio.AbstractEventLoop, seg: Segment,
                     items: list[tuple[int, asyncio.Future[None]]]) -> None:
        offsets = [offset_of(loc) for loc, _ in items]
        lengths = [record_len_of(loc) for loc, _ in items]
        first = seg.kills
        seg.kills += len(offsets)
        seg.acquire()  # keeps the fd open while it is punched
        try:
            punched = await loop.run_in_executor(
                self._executor, _kill_records, self.root, seg.file, first, offsets, lengths,
                self._sync, self.can_punch)
        except (OSError, BadSegment) as exc:
            seg.kills = first
            log.warning("disk tier: kill list of segment %016x not written (%s): %d deleted "
                        "blocks may come back after a restart", seg.seg_id, exc, len(offsets))
            return
        finally:
            seg.release()
        if punched < 0:
            self.can_punch = False
            log.info("disk tier: %s cannot punch holes; dead records are reclaimed by "
                     "compaction only", self.root)
        else:
            self.punched_bytes += punched

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def drain(self) -> None:
        """Wait until every queued kill and removal is done."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)


def _removable(seg: Segment) -> bool:
    return (seg.sealed and seg.entries is None and not seg.live_count and not seg.inflight
            and not seg.compacting and not seg.removed)


def _kill_records(root: Path, seg: SegmentFile, first: int, offsets: list[int],
                  lengths: list[int], sync: bool, can_punch: bool) -> int:
    """Write and sync the kill entries, then punch the records. Returns the bytes
    punched, or -1 when the filesystem cannot punch holes."""
    write_kills(root, seg, first, offsets, sync)
    if not can_punch:
        return 0
    total = 0
    for off, length in zip(offsets, lengths, strict=True):
        if off + length > seg.size:
            length = max(seg.size - off, 0)
        if length and not punch(seg.fd, off, length):
            return -1
        total += length
    return total


class Compactor:
    """Rewrites the live records of mostly-dead segments, one segment at a time."""

    def __init__(self, tier: DiskTier):
        self._tier = tier
        self._queue: deque[Segment] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.compacted = 0  # segments emptied by compaction
        self.moved_bytes = 0

    def submit(self, seg: Segment) -> None:
        if seg.compacting or self._closed:
            return
        seg.compacting = True
        self._queue.append(seg)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._queue:
            seg = self._queue.popleft()
            try:
                await self._compact(seg)
            except Exception as exc:  # a failed compaction leaves the segment as it was
                log.warning("disk tier: compaction of segment %016x stopped: %s", seg.seg_id, exc)
            finally:
                seg.compacting = False
            if not seg.live_count:
                self.compacted += 1
            self._tier._killer.maybe_remove(seg)

    async def _compact(self, seg: Segment) -> None:
        tier = self._tier
        footer = await tier._run(read_footer, tier.root, seg.file)
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future[None]] = []
        budget = 0
        for e in footer.entries:
            ns = footer.namespaces[e.ns]
            k = tier._keys.key(BlockKey(ns, e.hash))
            loc = tier._map.get(k) if k is not None else None
            if loc is None or seg_of(loc) != seg.seg_id or offset_of(loc) != e.offset:
                continue
            try:
                _, payload = await tier._read(seg, loc)
            except BadSegment as exc:
                if k is not None and tier._map.get(k) == loc:
                    tier._drop_corrupt(BlockKey(ns, e.hash), k, loc, exc)
                continue
            fut: asyncio.Future[None] = loop.create_future()
            tier._writer.submit(Write(entry_meta(e, ns), payload, fut, expect=loc))
            pending.append(fut)
            self.moved_bytes += e.payload_len
            budget += e.record_len
            if budget >= 4 * tier._writer.batch_bytes:
                await asyncio.gather(*pending, return_exceptions=True)
                pending, budget = [], 0
        await asyncio.gather(*pending, return_exceptions=True)

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def drain(self) -> None:
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def list_metas(self) -> list[BlockMeta]:
        """Every indexed block's metadata, from the footers (and the active segment)."""
        tier = self._tier
        metas: list[BlockMeta] = []
        for seg in sorted(tier._segments.values(), key=lambda s: s.seg_id):
            if seg.entries is not None:
                names = list(seg.namespaces)
                entries, namespaces = list(seg.entries), names
            elif seg.footer:
                footer = await tier._run(read_footer, tier.root, seg.file)
                entries, namespaces = footer.entries, footer.namespaces
            else:
                continue
            for e in entries:
                ns = namespaces[e.ns]
                k = tier._keys.key(BlockKey(ns, e.hash))
                loc = tier._map.get(k) if k is not None else None
                if loc is not None and seg_of(loc) == seg.seg_id and offset_of(loc) == e.offset:
                    metas.append(entry_meta(e, ns))
        return metas

    async def close(self) -> None:
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for seg in self._queue:
            seg.compacting = False
        self._queue.clear()
