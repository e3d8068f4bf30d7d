"""The disk tier: one self-describing, checksummed file per block.

Layout: ``root/<first 2 hex of the block hash>/<hash hex>.<namespace tag>.kvb``;
the file format is in :mod:`kvstore.tiers.diskformat`.

Writes are atomic: header + payload go to a temp file in the target directory,
which is fsynced, renamed over the final name, and the directory is fsynced. A
kill -9 at any point leaves either the old block, the new block, or a ``*.tmp``
leftover that :meth:`DiskTier.recover` removes; never a half-written block under
a block's name.

**No separate journal: the files are the manifest.** The rename is the commit
point of a block; a journal would be a second commit point that must agree with
the files (two fsyncs per put, compaction, and a repair pass when they disagree
after a crash). Since every file carries its full metadata, ``recover()`` scans
the headers (one small read per file, off the event loop), removes temp files
and files whose header, metadata checksum, name or size is wrong, and rebuilds
the index. Payload checksums are verified on every read instead of at recovery,
so a corrupt payload is found (raised as DataCorruption, file removed) when it is
first used, without reading the whole disk at start.

The index is rebuilt by ``recover()``, which runs by itself before the first
operation that needs it; the engine calls it at start to learn what is stored.
Capacity counts payload bytes (headers are not counted). When ``meta.checksum``
is set (non-zero) the payload is checked against it before writing, so a source
buffer that changed under a copy (e.g. a DRAM slot reused) is refused with
DataCorruption instead of being stored with a fresh, matching checksum. A full filesystem is a
clean refusal: TierFull, the temp file removed, every other block untouched.
Blocking I/O runs in a small thread pool owned by the tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar, cast

from kvstore.errors import BlockNotFound, DataCorruption, TierFull, TierUnavailable
from kvstore.tiers._common import as_bytes_view, check_put, tier_full
from kvstore.tiers.base import Tier
from kvstore.tiers.diskformat import BadBlockFile, file_name
from kvstore.tiers.diskio import ChangedPayload, Entry, read_block, scan, unlink, write_block
from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["DiskTier"]

_T = TypeVar("_T")
_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskTier(Tier):
    """Tier and :class:`~kvstore.tiers.base.PersistentTier` over files under ``root``.

    ``fsync=False`` skips the fsyncs (benchmarks only: a crash may then lose
    recent blocks, though never expose a torn one under its name).
    """

    medium = Medium.DISK

    def __init__(
        self,
        root: Path,
        capacity_bytes: int,
        name: str = "disk",
        *,
        fsync: bool = True,
        io_threads: int = 4,
    ):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.name = name
        self.root = Path(root)
        self._capacity = capacity_bytes
        self._fsync = fsync
        self._index: dict[BlockKey, Entry] = {}
        self._used = 0
        self._inflight = 0
        self._locks: dict[BlockKey, _KeyLock] = {}
        self._recovered = False
        self._recover_lock = asyncio.Lock()
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            io_threads, thread_name_prefix=f"kvstore-{name}"
        )
        try:
            self.root.mkdir(parents=True, exist_ok=True)
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

    def can_fit(self, size: int) -> bool:
        return self._pool is not None and 0 < size <= self._capacity - self.used_bytes

    async def put(self, meta: BlockMeta, payload: bytes | memoryview) -> None:
        view = as_bytes_view(payload)
        size = check_put(self.name, self._capacity, meta, view)
        await self._ready()
        # Shielded: a cancelled caller must not leave a renamed file out of the index.
        task = asyncio.ensure_future(self._store(meta, view, size))
        task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    async def _store(self, meta: BlockMeta, view: memoryview, size: int) -> None:
        key = meta.key
        async with self._lock(key):
            old = self._index.get(key)
            freed = old.meta.size if old is not None else 0
            if self.used_bytes - freed + size > self._capacity:
                raise tier_full(self.name, size, self.used_bytes, self._capacity)
            path = self._path(key)
            self._inflight += size
            try:
                checksum = await self._run(write_block, self.root, path, meta, view, self._fsync)
            except OSError as exc:
                raise self._io_error(exc, f"writing block {key}", size) from exc
            except ChangedPayload as exc:
                raise DataCorruption(
                    f"block {key} was not written to tier {self.name!r}: {exc} (the source "
                    "buffer changed or was corrupted before the write; nothing was stored)"
                ) from exc
            finally:
                self._inflight -= size
            stored = _replace_checksum(meta, checksum)
            self._index[key] = Entry(stored, path)
            self._used += size - freed

    async def get(self, key: BlockKey) -> memoryview:
        await self._ready()
        entry = self._entry(key)
        try:
            return await self._run(read_block, entry.path, key)
        except FileNotFoundError:
            await self._forget(key, entry)
            raise BlockNotFound(f"block {key} vanished from tier {self.name!r}") from None
        except BadBlockFile as exc:
            await self._forget(key, entry, remove=True)
            raise DataCorruption(
                f"block {key} in tier {self.name!r} is corrupt ({exc}); the file was removed"
            ) from exc
        except OSError as exc:
            raise self._io_error(exc, f"reading block {key}", 0) from exc

    async def contains(self, key: BlockKey) -> bool:
        await self._ready()
        return key in self._index

    async def delete(self, key: BlockKey) -> bool:
        await self._ready()
        async with self._lock(key):
            entry = self._index.pop(key, None)
            if entry is None:
                return False
            self._used -= entry.meta.size
            try:
                await self._run(unlink, entry.path)
            except OSError as exc:
                raise self._io_error(exc, f"deleting block {key}", 0) from exc
            return True

    async def put_many(self, items: Sequence[tuple[BlockMeta, bytes | memoryview]]) -> None:
        await _gather_all([self.put(m, p) for m, p in items])

    async def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | memoryview]:
        return list(await _gather_all([self.get(k) for k in keys]))

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)
            self._index.clear()
            self._used = 0

    # ---- PersistentTier -----------------------------------------------------------
    async def recover(self) -> list[BlockMeta]:
        """Scan ``root`` (once per instance): drop leftovers and damaged files, build
        the index. Later calls return the index without rescanning, since a scan
        would race with the writes in flight (their temp files are not leftovers)."""
        async with self._recover_lock:
            if self._recovered:
                return [e.meta for e in self._index.values()]
            try:
                found = await self._run(scan, self.root)
            except OSError as exc:
                raise self._io_error(exc, f"scanning {self.root}", 0) from exc
            self._index = {e.meta.key: e for e in found}
            self._used = sum(e.meta.size for e in found)
            self._recovered = True
            return [e.meta for e in found]

    # ---- internals ----------------------------------------------------------------
    async def _ready(self) -> None:
        if self._pool is None:
            raise TierUnavailable(f"tier {self.name!r} is closed")
        if not self._recovered:
            await self.recover()

    def _entry(self, key: BlockKey) -> Entry:
        entry = self._index.get(key)
        if entry is None:
            raise BlockNotFound(f"block {key} is not in tier {self.name!r}")
        return entry

    def _path(self, key: BlockKey) -> Path:
        return self.root / key.block_hash.hex()[:2] / file_name(key)

    def _lock(self, key: BlockKey) -> _KeyLock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = _KeyLock(self._locks, key)
        return lock

    async def _forget(self, key: BlockKey, entry: Entry, *, remove: bool = False) -> None:
        async with self._lock(key):
            if self._index.get(key) is not entry:  # replaced meanwhile: keep the new one
                return
            del self._index[key]
            self._used -= entry.meta.size
            if remove:
                with contextlib.suppress(OSError):  # the caller raises DataCorruption
                    await self._run(unlink, entry.path)

    async def _run(self, fn: Callable[..., _T], *args: object) -> _T:
        if self._pool is None:
            raise TierUnavailable(f"tier {self.name!r} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _io_error(self, exc: OSError, what: str, size: int) -> TierFull | TierUnavailable:
        if exc.errno in _FULL:
            return TierFull(
                f"tier {self.name!r}: the filesystem under {self.root} is full "
                f"({errno.errorcode.get(exc.errno or 0, exc.errno)}) while {what} "
                f"({size} bytes); nothing was stored, free disk space or evict"
            )
        return TierUnavailable(f"tier {self.name!r}: I/O error while {what}: {exc}")


class _KeyLock:
    """Per-key asyncio lock, dropped from its table when nobody holds or waits for it."""

    __slots__ = ("_key", "_lock", "_table", "_users")

    def __init__(self, table: dict[BlockKey, _KeyLock], key: BlockKey):
        self._table, self._key = table, key
        self._lock = asyncio.Lock()
        self._users = 0

    async def __aenter__(self) -> None:
        self._users += 1
        try:
            await self._lock.acquire()
        except BaseException:
            self._release_user()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._release_user()

    def _release_user(self) -> None:
        self._users -= 1
        if self._users == 0 and self._table.get(self._key) is self:
            del self._table[self._key]


async def _gather_all(aws: Sequence[Awaitable[_T]]) -> list[_T]:
    """Run all to completion; then raise the first failure, if any."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return cast(list[_T], results)


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved when the awaiting caller was cancelled


def _replace_checksum(meta: BlockMeta, checksum: int) -> BlockMeta:
    return meta if meta.checksum == checksum else replace(meta, checksum=checksum)
