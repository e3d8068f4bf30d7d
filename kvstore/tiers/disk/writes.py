"""The disk tier's write path: validate, reserve, queue to the group commit, index.

Part of :class:`~kvstore.tiers.disk.tier.DiskTier`: a put is checked and its bytes
counted in flight before it is queued (so the capacity checks of a batch see each
other's reservations), the group commit (:mod:`kvstore.tiers.disk.log`) writes it, and
:meth:`Writes._commit` indexes the durable record unless a newer record of its key is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstore.errors import DataCorruption, TierFull, TierUnavailable
from kvstore.tiers._common import as_bytes_view, check_put, tier_full
from kvstore.tiers.disk.index import pack, position, size_of
from kvstore.tiers.disk.log import ChangedPayload, Segment, Write
from kvstore.types import BlockMeta

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from kvstore.tiers.disk.compact import Killer
    from kvstore.tiers.disk.index import KeyTable
    from kvstore.tiers.disk.log import GroupWriter

__all__ = ["Writes"]


class Writes:
    """The write half of :class:`~kvstore.tiers.disk.tier.DiskTier`."""

    if TYPE_CHECKING:
        # What this part reads of the tier (set in DiskTier.__init__).
        name: str
        _capacity: int
        _reads: ThreadPoolExecutor | None
        _keys: KeyTable
        _map: dict[int, int]
        _used: int
        _inflight: int
        _writer: GroupWriter
        _killer: Killer

        @property
        def used_bytes(self) -> int: ...
        async def _ready(self) -> None: ...
        def _kill(self, loc: int) -> asyncio.Future[None]: ...
        def _io_error(self, exc: OSError, what: str, size: int
                      ) -> TierFull | TierUnavailable: ...

    async def put(self, meta: BlockMeta, payload: bytes | memoryview) -> None:
        await self._ready()
        fut = self._submit(meta, payload)
        try:
            await asyncio.shield(fut)  # a cancelled caller's write still lands in the index
        except (OSError, ChangedPayload) as exc:
            raise self._write_error(meta, exc) from exc

    def _submit(self, meta: BlockMeta, payload: bytes | memoryview) -> asyncio.Future[None]:
        """Validate, check capacity and queue one block (no await: capacity checks of
        a batch see each other's reservations)."""
        view = as_bytes_view(payload)
        size = check_put(self.name, self._capacity, meta, view)
        if self._reads is None:
            raise TierUnavailable(f"tier {self.name!r} is closed")
        k = self._keys.key_for_store(meta.key.namespace, meta.key.block_hash)
        old = self._map.get(k)
        freed = size_of(old) if old is not None else 0
        if self.used_bytes - freed + size > self._capacity:
            raise tier_full(self.name, size, self.used_bytes, self._capacity)
        self._inflight += size
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda _f: self._release_inflight(size))
        self._writer.submit(Write(meta, view, fut))
        return fut

    def _write_error(self, meta: BlockMeta, exc: BaseException) -> BaseException:
        if isinstance(exc, OSError):
            return self._io_error(exc, f"writing block {meta.key}", meta.size)
        if isinstance(exc, ChangedPayload):
            return DataCorruption(
                f"block {meta.key} was not written to tier {self.name!r}: {exc} (the source "
                "buffer changed or was corrupted before the write; nothing was stored)")
        return exc

    def _release_inflight(self, size: int) -> None:
        self._inflight -= size

    def _commit(self, w: Write, seg: Segment, offset: int, checksum: int) -> None:
        """A record is durable: index it (unless a newer record of its key is)."""
        m = w.meta
        k = self._keys.key_for_store(m.key.namespace, m.key.block_hash)
        loc = pack(seg.seg_id, offset, w.record_len, m.size)
        cur = self._map.get(k)
        stale = (cur != w.expect) if w.expect is not None else (
            cur is not None and position(cur) > position(loc))
        if stale:  # replaced or deleted meanwhile: this record is dead on arrival
            self._killer.kill(seg, loc, counted=False)
            return
        self._map[k] = loc
        seg.live_count += 1
        seg.live_bytes += w.record_len
        if cur is not None:
            self._used -= size_of(cur)
            self._kill(cur)
        self._used += m.size

    async def put_many(self, items: Sequence[tuple[BlockMeta, bytes | memoryview]]) -> None:
        """Queue every block at once (they share group commits), wait for all, then
        raise the first failure, if any."""
        await self._ready()
        first: BaseException | None = None
        waiting: list[tuple[BlockMeta, asyncio.Future[None]]] = []
        for meta, payload in items:
            try:
                waiting.append((meta, self._submit(meta, payload)))
            except Exception as exc:
                first = first or exc
        if waiting:
            await asyncio.wait([f for _, f in waiting])
        for meta, fut in waiting:
            failure = fut.exception()
            if failure is not None and first is None:
                first = self._write_error(meta, failure)
        if first is not None:
            raise first
