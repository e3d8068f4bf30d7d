"""The disk tier: append-only segment files, group commit, a compact index.

Design, chosen by measurement (``kvstore bench-tiers disk`` and
``restart``; numbers in docs/BENCHMARKS.md): the previous tier wrote one file
per block with an fsync of the file and of its directory, 0.5-0.6 GB/s on a
disk that takes 1.4+ GB/s of direct I/O, and restarted by opening every file.
Here:

* **Segments, group commit** (:mod:`kvstore.tiers.disk.log`): blocks are appended
  as checksummed records to preallocated segment files; puts that arrive
  together share one write and one ``fdatasync``; several batches are in flight
  at once to keep the device queue full. A put returns once its record is
  durable, so every block the tier acknowledged survives a crash.
* **O_DIRECT** where the filesystem allows it (measured: buffered writes plus
  ``fdatasync`` ran at a fraction of direct writes on the same disk, and reads
  through the page cache cache twice what the DRAM tier already caches);
  buffers are 4 KiB aligned and every record starts on a 4 KiB boundary.
* **Every read verified**: the record header (segment nonce, offset, checksum),
  the key and the payload checksum; a mismatch is DataCorruption (the block is
  dropped, logged and counted in ``damaged``), never bytes.
* **Deletes and replacements** append the record's offset to the segment's kill
  list (synced before ``delete`` returns) and then punch the record out of the
  file (``FALLOC_FL_PUNCH_HOLE``), which frees its space at once. A sealed
  segment with no live record left is removed; one whose live records fill
  less than a quarter of it is compacted: they are rewritten through the
  group commit and the segment is removed.
* **Restart** (:mod:`kvstore.tiers.disk.recover`) reads each sealed segment's
  footer and kill list, not its records, and scans only a segment that has no
  footer (the one being written at a crash).
* **Compact index** (:mod:`kvstore.tiers.disk.index`): two Python ints per
  block; namespace, token ids and the rest live in the records and footers
  (:meth:`DiskTier.read_meta` reads them back).

Each segment keeps one file descriptor open (the tier lifts the soft open-file
limit to the hard one); segments are ``capacity / 64`` (4 MiB to 1 GiB) by default.

Capacity counts payload bytes (headers, padding and footers are not counted).
When ``meta.checksum`` is set (non-zero) the bytes written are checked against
it, so a source buffer that changed under the copy (e.g. a DRAM slot reused) is
refused with DataCorruption. A full filesystem is a clean refusal: TierFull,
nothing indexed, every other block untouched. ``fsync=False`` (benchmarks
only) skips the syncs: a crash may then lose acknowledged blocks, though never
serve a torn one.

The tier is one class over the state its parts share (the index, the in-flight byte
count, the segment map), put together from its parts: the write path
(:mod:`kvstore.tiers.disk.writes`), the first operation's recovery
(:mod:`kvstore.tiers.disk.startup`), and here the reads, deletes, closing and the
internals they share. Each part that runs on its own (format, segment I/O, group
commit, index encoding, compaction, recovery) is its own module in this package.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash

from kvstore.errors import BlockNotFound, DataCorruption, TierFull, TierUnavailable
from kvstore.tiers._common import gather_all
from kvstore.tiers.base import Tier
from kvstore.tiers.disk.compact import Compactor, Killer
from kvstore.tiers.disk.format import BadSegment, RecordMeta
from kvstore.tiers.disk.index import (
    KeyTable,
    offset_of,
    record_len_of,
    seg_of,
    size_of,
)
from kvstore.tiers.disk.log import GroupWriter, Segment
from kvstore.tiers.disk.recover import RecoveryReport
from kvstore.tiers.disk.segment import (
    default_segment_bytes,
    lift_fd_limit,
    make_private_dir,
    read_record,
)
from kvstore.tiers.disk.startup import Startup
from kvstore.tiers.disk.writes import Writes
from kvstore.types import BlockKey, BlockMeta, Medium, Workload

__all__ = ["DiskTier", "default_segment_bytes"]

log = logging.getLogger(__name__)

_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskTier(Writes, Startup, Tier):
    """Tier and :class:`~kvstore.tiers.base.PersistentTier` over segments under ``root``."""

    medium = Medium.DISK

    def __init__(self, root: Path, capacity_bytes: int, name: str = "disk", *,
                 fsync: bool = True, direct_io: bool = True, segment_bytes: int = 0,
                 batch_bytes: int = 8 << 20, write_jobs: int = 4, io_threads: int = 8):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.name = name
        self.root = Path(root)
        self._capacity = capacity_bytes
        self._sync = fsync
        self._direct = direct_io
        self._keys = KeyTable()
        self._map: dict[int, int] = {}
        self._segments: dict[int, Segment] = {}
        self._used = 0
        self._inflight = 0
        #: Directory entries skipped at start, and records / files dropped for failed
        #: checks (at start and on reads) since this tier was opened.
        self.skipped = 0
        self.damaged = 0
        self.report: RecoveryReport | None = None
        self._recovered = False
        self._recover_lock = asyncio.Lock()
        self._writes = ThreadPoolExecutor(write_jobs + 2, thread_name_prefix=f"kvstore-{name}-w")
        self._reads: ThreadPoolExecutor | None = ThreadPoolExecutor(
            io_threads, thread_name_prefix=f"kvstore-{name}-r")
        self._writer = GroupWriter(
            self.root, self._writes, self._commit, segments=self._segments, next_id=1,
            segment_size=segment_bytes or default_segment_bytes(capacity_bytes),
            batch_bytes=batch_bytes, max_jobs=write_jobs, direct=direct_io, sync=fsync,
            on_sealed=self._on_sealed)
        self._killer = Killer(self.root, self._writes, self._segments, fsync,
                              on_empty=self._remove_segment, on_sparse=self._maybe_compact)
        self._compactor = Compactor(self)
        lift_fd_limit()
        try:
            make_private_dir(self.root)
        except OSError as exc:
            raise TierUnavailable(f"tier {name!r}: cannot create {self.root}: {exc}") from exc

    # ---- Tier ---------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        """Stored payload bytes plus those of writes in flight."""
        return self._used + self._inflight

    @property
    def blocks(self) -> int:
        return len(self._map)

    @property
    def startup_skipped(self) -> int:
        """What the start could not use (the engine's Stats ``startup_skipped``): directory
        entries skipped, and segments, records and kill entries dropped for failed checks."""
        r = self.report
        return len(r.skipped) + r.damaged + r.torn if r is not None else 0

    def can_fit(self, size: int) -> bool:
        return self._reads is not None and 0 < size <= self._capacity - self.used_bytes

    async def get(self, key: BlockKey) -> memoryview:
        await self._ready()
        k, loc = self._find(key)
        seg = self._segments[seg_of(loc)]
        try:
            meta, payload = await self._read(seg, loc)
        except BadSegment as exc:
            if self._map.get(k) != loc:
                raise BlockNotFound(f"block {key} left tier {self.name!r} while read") from None
            raise self._drop_corrupt(key, k, loc, exc) from exc
        except OSError as exc:
            raise self._io_error(exc, f"reading block {key}", 0) from exc
        if meta.ns != key.namespace or meta.hash != key.block_hash:
            raise BlockNotFound(f"block {key} is not in tier {self.name!r}")
        return payload

    def _drop_corrupt(self, key: BlockKey, k: int, loc: int, exc: Exception) -> DataCorruption:
        """Take a block whose record failed its checks out of the tier (logged, counted)."""
        self._map.pop(k)
        self._used -= size_of(loc)
        self._kill(loc)
        self.damaged += 1
        log.warning("tier %r: block %s is corrupt and was dropped: %s", self.name, key, exc)
        return DataCorruption(f"block {key} in tier {self.name!r} is corrupt ({exc}); dropped")

    async def read_meta(self, key: BlockKey) -> BlockMeta:
        """A stored block's full metadata (token ids included), read from its record."""
        await self._ready()
        _, loc = self._find(key)
        try:
            meta, payload = await self._read(self._segments[seg_of(loc)], loc)
        except (BadSegment, OSError) as exc:
            raise BlockNotFound(f"block {key}: record unreadable ({exc})") from exc
        return BlockMeta(key, meta.parent, meta.tokens, size_of(loc),
                         xxhash.xxh3_64_intdigest(payload), meta.session,
                         Workload.parse(meta.workload), meta.created, meta.num_tokens)

    async def contains(self, key: BlockKey) -> bool:
        await self._ready()
        k = self._keys.key(key)
        return k is not None and k in self._map

    async def delete(self, key: BlockKey) -> bool:
        """Remove a block; its kill is durable (and its space freed) when this returns."""
        await self._ready()
        k = self._keys.key(key)
        loc = self._map.pop(k, None) if k is not None else None
        if loc is None:
            return False
        self._used -= size_of(loc)
        await self._kill(loc)
        return True

    async def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | memoryview]:
        return list(await gather_all([self.get(k) for k in keys]))

    async def delete_many(self, keys: Sequence[BlockKey]) -> int:
        return sum(await gather_all([self.delete(k) for k in keys]))

    async def close(self) -> None:
        reads, self._reads = self._reads, None
        if reads is None:
            return
        if self._recovered:
            await self._compactor.close()
            await self._writer.close()
            await self._killer.drain()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, reads.shutdown)
        await loop.run_in_executor(None, self._writes.shutdown)
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
        self._map.clear()
        self._used = 0

    async def settle(self) -> None:
        """Wait until writes, kills, removals and compaction are all idle (tests, benchmarks)."""
        while True:
            await self._writer.flush()
            await self._killer.drain()
            await self._compactor.drain()
            if not (self._killer.busy or self._compactor.busy or self._writer.busy):
                return

    # ---- internals ----------------------------------------------------------------
    def _find(self, key: BlockKey) -> tuple[int, int]:
        k = self._keys.key(key)
        loc = self._map.get(k) if k is not None else None
        if k is None or loc is None:
            raise BlockNotFound(f"block {key} is not in tier {self.name!r}")
        return k, loc

    async def _read(self, seg: Segment, loc: int) -> tuple[RecordMeta, memoryview]:
        if self._reads is None:
            raise TierUnavailable(f"tier {self.name!r} is closed")
        seg.acquire()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._reads, read_record, seg.file, offset_of(loc), record_len_of(loc))
        finally:
            seg.release()

    def _kill(self, loc: int) -> asyncio.Future[None]:
        seg = self._segments.get(seg_of(loc))
        if seg is None or seg.removed:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return self._killer.kill(seg, loc, counted=True)

    def _on_sealed(self, seg: Segment) -> None:
        if not seg.live_count:
            self._killer.maybe_remove(seg)
        else:
            self._maybe_compact(seg)

    def _maybe_compact(self, seg: Segment) -> None:
        if seg.sealed and seg.footer and not seg.compacting and seg.live_bytes * 4 < seg.tail:
            self._compactor.submit(seg)

    def _remove_segment(self, seg: Segment) -> None:
        del self._segments[seg.seg_id]
        seg.retire()

    async def _run(self, fn: Any, *args: object) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._writes, fn, *args)

    def _io_error(self, exc: OSError, what: str, size: int) -> TierFull | TierUnavailable:
        if exc.errno in _FULL:
            return TierFull(
                f"tier {self.name!r}: the filesystem under {self.root} is full "
                f"({errno.errorcode.get(exc.errno or 0, exc.errno)}) while {what} "
                f"({size} bytes); nothing was stored, free disk space or evict"
            )
        return TierUnavailable(f"tier {self.name!r}: I/O error while {what}: {exc}")
