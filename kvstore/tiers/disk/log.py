"""Group commit for the disk tier: many puts share one write and one ``fdatasync``.

Puts queue up here; up to ``max_jobs`` write jobs run at once in the tier's
threads. A job takes what is queued (up to ``batch_bytes``, at least one block),
reserves that many bytes at the end of the active segment, lays the records out
in one aligned buffer (header, metadata, payload copied in and checksummed,
zero padding to 4 KiB), writes it with one ``pwrite`` (``O_DIRECT`` where the
filesystem allows it) and makes it durable with one ``fdatasync``. Only then are
the blocks committed to the index and their puts answered: a block a put
acknowledged is on the device. Under load, puts that arrive while jobs run
gather into the next batch, so the fsync cost is shared by many blocks; several
jobs in flight keep the device queue busy.

When the active segment has no room for a batch it is sealed (no more writes;
once its last job finishes, its unused preallocated tail is truncated away and
its footer is written) and a fresh segment, with the next id, becomes active.

A crash mid-batch leaves a region of the segment half written; its records are
never acknowledged, and recovery skips what fails its checksums.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kvstore.tiers.disk.format import (
    ALIGN,
    RECORD,
    Footer,
    FooterEntry,
    align,
    encode_record_header,
    encode_tokens,
    record_meta_of,
)
from kvstore.tiers.disk.segment import SegmentFile, aligned, create_segment, write_at, write_footer
from kvstore.types import BlockMeta

__all__ = ["ChangedPayload", "GroupWriter", "Segment", "Write"]

log = logging.getLogger(__name__)


class ChangedPayload(Exception):
    """The bytes handed to put no longer match the checksum the caller computed."""


@dataclass(eq=False, slots=True)
class Segment:
    """The tier's live view of one segment file (state changes on the event loop only)."""

    file: SegmentFile
    tail: int  # end of the last reservation
    sealed: bool = False
    inflight: int = 0  # write jobs in flight
    readers: int = 0  # reads in flight (the fd stays open while > 0)
    live_count: int = 0
    live_bytes: int = 0  # record bytes of indexed records
    kills: int = 0  # entries in the kill list
    entries: list[FooterEntry] | None = None  # active segment: its footer so far
    namespaces: dict[str, int] = field(default_factory=dict)
    footer: bool = False
    compacting: bool = False
    removed: bool = False  # its files are gone; the fd closes after the last reader
    closed: bool = False

    @property
    def seg_id(self) -> int:
        return self.file.seg_id

    def acquire(self) -> None:
        self.readers += 1

    def release(self) -> None:
        self.readers -= 1
        if self.removed and not self.readers:
            self.close()

    def retire(self) -> None:
        """Its files were removed: close the fd now or after the last reader."""
        self.removed = True
        if not self.readers:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.file.fd)


@dataclass(eq=False, slots=True)
class Write:
    """One block waiting to be written."""

    meta: BlockMeta
    payload: memoryview
    future: asyncio.Future[None]
    meta_bytes: bytes = b""
    record_len: int = 0
    #: Compaction: commit only if the block is still at this location.
    expect: int | None = None

    def __post_init__(self) -> None:
        self.meta_bytes = record_meta_of(self.meta)
        self.record_len = align(RECORD.size + len(self.meta_bytes) + self.payload.nbytes)


#: commit(write, segment, offset, checksum): index a block whose record is durable.
Commit = Callable[[Write, Segment, int, int], None]


class GroupWriter:
    def __init__(self, root: Path, executor: Executor, commit: Commit, *,
                 segments: dict[int, Segment], next_id: int, segment_size: int,
                 batch_bytes: int, max_jobs: int, direct: bool, sync: bool,
                 on_sealed: Callable[[Segment], None]):
        self.root = root
        self._executor = executor
        self._commit = commit
        self.segments = segments
        self.next_id = next_id
        self.segment_size = segment_size
        self.batch_bytes = batch_bytes
        self.max_jobs = max_jobs
        self.direct = direct
        self.sync = sync
        self._on_sealed = on_sealed
        self.active: Segment | None = None
        self._queue: deque[Write] = deque()
        self._jobs = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._rotate = asyncio.Lock()
        self._buffers: list[memoryview] = []
        self._spare: asyncio.Future[Segment | None] | None = None
        self._sealing: set[asyncio.Task[None]] = set()
        self.batches = 0  # write jobs done (for the benchmark: blocks per fsync)
        self.blocks = 0

    # ---- queueing -----------------------------------------------------------------
    def submit(self, write: Write) -> None:
        self._queue.append(write)
        self._kick()

    def _kick(self) -> None:
        while self._queue and self._jobs < self.max_jobs:
            batch = [self._queue.popleft()]
            size = batch[0].record_len
            while self._queue and size + self._queue[0].record_len <= self.batch_bytes:
                size += self._queue[0].record_len
                batch.append(self._queue.popleft())
            self._jobs += 1
            self._idle.clear()
            asyncio.get_running_loop().create_task(self._job(batch, size))

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._jobs or self._sealing)

    async def flush(self) -> None:
        """Wait until everything queued is written and committed (or failed)."""
        while self._queue or self._jobs:
            await self._idle.wait()
        while self._sealing:
            await asyncio.gather(*list(self._sealing), return_exceptions=True)

    # ---- one batch ----------------------------------------------------------------
    async def _job(self, batch: list[Write], size: int) -> None:
        loop = asyncio.get_running_loop()
        seg: Segment | None = None
        try:
            seg = await self._reserve(size)
            base = seg.tail
            seg.tail += size
            seg.inflight += 1
            buf = None
            if size <= self.batch_bytes:  # reused: a fresh buffer costs a page fault per 4 KiB
                buf = self._buffers.pop() if self._buffers else aligned(self.batch_bytes)
            items = [(w.payload, w.meta_bytes, w.record_len, w.meta.checksum) for w in batch]
            try:
                results = await loop.run_in_executor(
                    self._executor, _write_batch, seg.file, base, items, buf, self.sync)
            finally:
                if buf is not None:
                    self._buffers.append(buf)
            self.batches += 1
            offset = base
            for w, res in zip(batch, results, strict=True):
                if isinstance(res, Exception):
                    _fail(w, res)
                else:
                    self._record(seg, w, offset, res)
                    self._commit(w, seg, offset, res)
                    self.blocks += 1
                    if not w.future.done():
                        w.future.set_result(None)
                offset += w.record_len
        except Exception as exc:  # nothing of this batch was acknowledged
            for w in batch:
                _fail(w, exc)
        finally:
            if seg is not None and seg.inflight:
                seg.inflight -= 1
                if seg.sealed and not seg.inflight:
                    self._finish_seal(seg)
            self._jobs -= 1
            if not self._jobs and not self._queue:
                self._idle.set()
            self._kick()

    def _record(self, seg: Segment, w: Write, offset: int, checksum: int) -> None:
        if seg.entries is None:  # pragma: no cover - a sealed segment takes no writes
            return
        m = w.meta
        ns = seg.namespaces.setdefault(m.key.namespace, len(seg.namespaces))
        seg.entries.append(FooterEntry(
            offset, w.record_len, m.size, checksum, ns, m.key.block_hash, m.parent_hash,
            encode_tokens(m.token_ids), m.session_id, str(m.workload), m.created_at,
            m.num_tokens))

    async def _reserve(self, size: int) -> Segment:
        async with self._rotate:
            seg = self.active
            if seg is None or seg.tail + size > seg.file.size:
                need = align(size) + ALIGN
                spare, self._spare = self._spare, None
                new = await spare if spare is not None else None
                if new is not None and new.file.size < need:  # too small for this batch
                    self.seal(new)
                    new = None
                if new is None:
                    new = await self._create(max(self.segment_size, need))
                if seg is not None:
                    self.seal(seg)
                self.active = seg = new
            if self._spare is None and seg.tail + size > seg.file.size // 2:
                # Create the next segment while this one fills: rotation does not wait.
                self._spare = asyncio.ensure_future(self._create_spare())
            return seg

    async def _create(self, size: int) -> Segment:
        seg_id = self.next_id
        self.next_id += 1
        file = await asyncio.get_running_loop().run_in_executor(
            self._executor, create_segment, self.root, seg_id, size, self.direct, self.sync)
        seg = Segment(file, tail=ALIGN, entries=[])
        self.segments[seg_id] = seg
        return seg

    async def _create_spare(self) -> Segment | None:
        try:
            return await self._create(self.segment_size)
        except OSError as exc:  # e.g. a full disk: the rotation tries again and reports it
            log.info("disk tier: next segment not created ahead: %s", exc)
            return None

    # ---- sealing ------------------------------------------------------------------
    def seal(self, seg: Segment) -> None:
        """No more writes into ``seg``; its footer follows its last write."""
        if seg.sealed:
            return
        seg.sealed = True
        if seg is self.active:
            self.active = None
        if not seg.inflight:
            self._finish_seal(seg)

    def _finish_seal(self, seg: Segment) -> None:
        task = asyncio.get_running_loop().create_task(self._write_footer(seg))
        self._sealing.add(task)
        task.add_done_callback(self._sealing.discard)

    async def _write_footer(self, seg: Segment) -> None:
        entries = sorted(seg.entries or [], key=lambda e: e.offset)
        footer = Footer(list(seg.namespaces), entries)
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, _seal_files, self.root, seg.file, seg.tail, footer, self.sync)
        except OSError as exc:  # the next start scans the segment instead
            log.warning("disk tier: footer of segment %016x not written (%s); the next "
                        "start will scan it", seg.seg_id, exc)
        else:
            seg.footer = True
            seg.file.size = seg.tail
        seg.entries = None
        seg.namespaces = {}
        self._on_sealed(seg)

    async def close(self) -> None:
        await self.flush()
        spare, self._spare = self._spare, None
        if spare is not None and (seg := await spare) is not None:
            self.seal(seg)
        if self.active is not None:
            self.seal(self.active)
        while self._sealing:
            await asyncio.gather(*list(self._sealing), return_exceptions=True)


def _fail(w: Write, exc: BaseException) -> None:
    if not w.future.done():
        w.future.set_exception(exc)


def _write_batch(seg: SegmentFile, base: int, items: list[tuple[memoryview, bytes, int, int]],
                 buf: memoryview | None, sync: bool) -> list[int | Exception]:
    """Lay out, write and sync one batch (in a worker thread). Returns each record's
    payload checksum, or the ChangedPayload that kept it out."""
    total = sum(rec_len for _, _, rec_len, _ in items)
    out = buf if buf is not None else aligned(total)
    arr: Any = np.frombuffer(out, dtype=np.uint8)
    results: list[int | Exception] = []
    pos = 0
    for payload, meta, rec_len, expected in items:
        start = pos + RECORD.size + len(meta)
        end = start + payload.nbytes
        np.copyto(arr[start:end], np.frombuffer(payload, dtype=np.uint8))
        checksum = xxhash.xxh3_64_intdigest(out[start:end])  # of the bytes written
        if expected and checksum != expected:
            results.append(ChangedPayload(
                f"payload xxh3-64 {checksum:#x} != meta.checksum {expected:#x}"))
            arr[pos : pos + rec_len] = 0
        else:
            out[pos:start] = encode_record_header(
                seg.nonce, base + pos, rec_len, payload.nbytes, checksum, meta) + meta
            arr[end : pos + rec_len] = 0
            results.append(checksum)
        pos += rec_len
    if any(not isinstance(r, Exception) for r in results):
        write_at(seg.fd, out[:total], base)
        if sync:
            os.fdatasync(seg.fd)
    return results


def _seal_files(root: Path, seg: SegmentFile, tail: int, footer: Footer, sync: bool) -> None:
    os.ftruncate(seg.fd, tail)  # the preallocated room it will never use
    if sync:
        os.fdatasync(seg.fd)
    write_footer(root, seg, footer, sync)
