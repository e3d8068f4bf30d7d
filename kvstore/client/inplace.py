"""Reading and writing blocks where they lie: the blocking client's in-place calls.

``put_in_place`` hands the caller the shared-memory slots it reserved, to write
payloads into; ``get_in_place`` / ``lease_in_place`` hand it the stored slots
under a lease, to read from. No payload is copied on the way (the vLLM
connector copies KV tensors straight in and out); over gRPC both fall back to
plain buffers. A mixin of :class:`~kvstore.client.sync.KVStoreClient`, which
provides the plumbing declared below; reads held past the call (``hold_in_place``,
``lookup_and_hold``) build on it in :mod:`kvstore.client.holding`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import xxhash

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.client._common import (
    RESERVE_BLOCKS,
    RESERVE_BYTES,
    BlockSpec,
    LeaseRead,
    SlotCallback,
    acquired_slots,
    batch_bounds,
    commit_request,
    header,
    put_requests,
    tags,
)
from kvstore.client.held import Renewer
from kvstore.client.segments import SegmentCache, SlotBuffer
from kvstore.errors import InvalidArgument, KVStoreError, LeaseExpired, TierFull
from kvstore.types import BlockData

__all__ = ["InPlace"]

log = logging.getLogger("kvstore.client")

#: Below this many bytes in one call, checksums are taken on the calling thread only.
PARALLEL_HASH_BYTES = 4 * 2**20
#: An in-place put hands ``fill`` about this many bytes at a time, and checksums
#: each chunk on a call thread while the next one is filled.
FILL_CHUNK_BYTES = 8 * 2**20

#: xxhash lets go of the GIL for a buffer about this large or larger (measured here:
#: two threads hashing 64 KiB buffers took as long as one, 256 KiB ones 1.5x less).
UNLOCKED_HASH_BYTES = 256 * 2**10
#: Small slots are filled and hashed about this many bytes at a time (in the core's cache
#: between the two; each ``fill`` call may have a cost of its own, as the vLLM
#: connector's gather does, so not one slot at a time).
CACHED_FILL_BYTES = 1 * 2**20

T = TypeVar("T")


def _digests(views: Sequence[memoryview]) -> list[int]:
    return [xxhash.xxh3_64_intdigest(v) for v in views]


class InPlace:
    """In-place puts and gets over the client's channel and segments."""

    address: str
    timeout: float
    _stub: Any
    _segments: SegmentCache
    _pool: ThreadPoolExecutor | None
    _probe_lock: threading.Lock
    _renewer: Renewer
    _packed_commit: bool

    if TYPE_CHECKING:

        @property
        def uses_shared_memory(self) -> bool: ...

        def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

        def _get_grpc(self, namespace: str, hashes: list[bytes]) -> list[BlockData | None]: ...

        def _release_quietly(self, request: pb.ReleaseRequest) -> None: ...

    def put_in_place(self, namespace: str, blocks: Sequence[BlockSpec], fill: SlotCallback,
                     session_id: str | None = None, workload: str | None = None, *,
                     request_id: str | None = None) -> int:
        """Store blocks whose payloads ``fill`` writes where they will live; returns how
        many were new.

        ``fill(batch)`` gets ``(i, slot)`` for blocks ``blocks[i]`` and must write exactly
        ``blocks[i].size`` bytes into each ``slot``. Over shared memory the slots are the
        reserved ones themselves (the payload is written once, in place) and blocks the
        store holds already are left out; over gRPC they are fresh buffers for every
        block, streamed afterwards (the server drops duplicates). An exception
        from ``fill`` aborts the batch's reservation and propagates."""
        t = tags(session_id, workload, request_id)
        if not self.uses_shared_memory:
            return self._put_filled_grpc(namespace, blocks, fill, t)
        # One Reserve and one Commit for a request's blocks (up to RESERVE_BYTES /
        # RESERVE_BLOCKS); past that, pipelined: batch k+1 is reserved while batch k is
        # filled, and batch k is committed while k+1 is filled.
        todo = list(batch_bounds([b.size for b in blocks], RESERVE_BYTES, RESERVE_BLOCKS))
        stored = 0
        pending: Callable[[], int] = lambda: 0  # noqa: E731
        ahead = (self._reserve_async(namespace, blocks[todo[0][0]:todo[0][1]], t) if todo
                 else None)
        try:
            for k, (start, end) in enumerate(todo):
                nxt = todo[k + 1] if k + 1 < len(todo) else None
                resv, ahead = (ahead() if ahead else None), None
                if resv is None:  # did not fit while earlier slots were held: settle, halve
                    stored += pending()
                    pending = lambda: 0  # noqa: E731
                    stored += self._put_small(namespace, blocks, start, end, fill, t)
                    ahead = (self._reserve_async(namespace, blocks[nxt[0]:nxt[1]], t) if nxt
                             else None)
                    continue
                ahead = (self._reserve_async(namespace, blocks[nxt[0]:nxt[1]], t) if nxt
                         else None)
                written = self._fill(blocks, start, resv, fill)
                stored += pending()
                pending = self._commit(namespace, *written, t)
            return stored + pending()
        except BaseException:
            if ahead is not None:  # free the next batch's slots now, not at lease expiry
                with contextlib.suppress(Exception):
                    resv = ahead()
                    ids = [d.slot_id for d in resv.slots if d.slot_id] if resv else []
                    if ids:
                        self._call(self._stub.Abort, pb.AbortRequest(slot_ids=ids))
            raise

    def _background(self, fn: Callable[[], T]) -> Callable[[], T]:
        """Run ``fn`` on the client's call threads; returns a call that waits for it.
        (A unary ``future()`` of grpc's blocking stack can block until an earlier
        call's reply arrives; a thread of our own never does.)"""
        with self._probe_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(4, thread_name_prefix="kvstore-client")
            future = self._pool.submit(fn)
        return future.result

    def _reserve_async(self, namespace: str, blocks: Sequence[BlockSpec], t: dict[str, str]
                       ) -> Callable[[], pb.ReserveResponse | None]:
        """Send a Reserve; returns a call that waits for its slots (``None`` when the
        tier cannot hold the whole batch now)."""
        request = pb.ReserveRequest(namespace=namespace, sizes=[b.size for b in blocks],
                                    block_hashes=[bytes(b.block_hash) for b in blocks], **t)

        def reserve() -> pb.ReserveResponse | None:
            try:
                resp: pb.ReserveResponse = self._call(self._stub.Reserve, request)
            except TierFull:
                if len(blocks) == 1:
                    raise
                return None
            return resp

        return self._background(reserve)

    def _put_filled_grpc(self, namespace: str, blocks: Sequence[BlockSpec], fill: SlotCallback,
                         t: dict[str, str]) -> int:
        buffers = [bytearray(b.size) for b in blocks]
        fill([(i, SlotBuffer(memoryview(buf), 0, len(buf))) for i, buf in enumerate(buffers)])
        data = [BlockData(b.block_hash, b.parent_hash, b.token_ids, bytes(buf))
                for b, buf in zip(blocks, buffers, strict=True)]
        return int(self._call(self._stub.Put, put_requests(namespace, data, t)).stored)

    def _put_small(self, namespace: str, blocks: Sequence[BlockSpec], start: int, end: int,
                   fill: SlotCallback, t: dict[str, str]) -> int:
        """A batch that did not fit at once: halve it until it does (no pipelining)."""
        resv = self._reserve_async(namespace, blocks[start:end], t)()
        if resv is None:
            half = (start + end) // 2
            return (self._put_small(namespace, blocks, start, half, fill, t)
                    + self._put_small(namespace, blocks, half, end, fill, t))
        return self._commit(namespace, *self._fill(blocks, start, resv, fill), t)()

    def _fill(self, blocks: Sequence[BlockSpec], start: int, resv: pb.ReserveResponse,
              fill: SlotCallback) -> tuple[list[pb.SlotDescriptor], list[int],
                                           list[pb.BlockHeader]]:
        """Write the reserved slots; returns the ones written, the writer's checksum of
        each and their headers."""
        slots, headers = [], []
        todo: list[tuple[int, SlotBuffer]] = []
        digests: list[int] = []
        try:
            for i, d in enumerate(resv.slots, start):
                if not d.slot_id:
                    continue  # already stored
                todo.append((i, self._segments.slot(d)))
                slots.append(d)
                headers.append(header(blocks[i], blocks[i].size))
            if todo:
                # The writer's checksum travels with the commit: the server records it
                # instead of reading the slots again (readers check it).
                digests = self._fill_and_hash(todo, fill)
        except BaseException:
            ids = [d.slot_id for d in resv.slots if d.slot_id]
            if ids:
                self._call(self._stub.Abort, pb.AbortRequest(slot_ids=ids))
            raise
        return slots, digests, headers

    def _fill_and_hash(self, todo: list[tuple[int, SlotBuffer]], fill: SlotCallback
                       ) -> list[int]:
        """``fill`` the slots and return each one's xxh3-64: large slots FILL_CHUNK_BYTES
        at a time, a chunk hashed on a call thread while the next one is filled; small
        ones (which xxhash hashes holding the GIL) CACHED_FILL_BYTES at a time, each such
        chunk hashed here right after its fill."""
        total = sum(slot.length for _, slot in todo)
        if total < PARALLEL_HASH_BYTES:
            fill(todo)
            return [xxhash.xxh3_64_intdigest(slot.view()) for _, slot in todo]
        if total < len(todo) * UNLOCKED_HASH_BYTES:
            # Small slots: xxhash keeps the GIL for them, so a call thread hashing one
            # chunk would only take turns with the filling of the next. Each small
            # chunk is hashed here right after it is filled, while it is in cache.
            out: list[int] = []
            per = max(1, CACHED_FILL_BYTES * len(todo) // total)
            for k in range(0, len(todo), per):
                chunk = todo[k:k + per]
                fill(chunk)
                out += [xxhash.xxh3_64_intdigest(slot.view()) for _, slot in chunk]
            return out
        hashing: list[Callable[[], list[int]]] = []
        start = size = 0
        for k, (_, slot) in enumerate(todo):
            size += slot.length
            if size >= FILL_CHUNK_BYTES or k == len(todo) - 1:
                chunk = todo[start:k + 1]
                fill(chunk)
                views = [s.view() for _, s in chunk]
                hashing.append(self._background(functools.partial(_digests, views)))
                start, size = k + 1, 0
        return [digest for done in hashing for digest in done()]

    def _commit(self, namespace: str, slots: list[pb.SlotDescriptor], digests: list[int],
                headers: list[pb.BlockHeader], t: dict[str, str]) -> Callable[[], int]:
        """Send the commit; returns a call that waits for it."""
        if not slots:
            return lambda: 0
        request = commit_request(namespace, slots, digests, headers, t, self._packed_commit)
        return self._background(lambda: int(self._call(self._stub.Commit, request).stored))

    def get_in_place(self, namespace: str, hashes: Sequence[bytes], read: SlotCallback, *,
                     max_batch: int = 256, verify: bool = True) -> list[int]:
        """Hand the stored blocks to ``read`` where they lie; returns each block's payload
        length, 0 where it is missing.

        ``read(batch)`` gets ``(i, slot)`` for stored blocks of ``hashes``, up to
        ``max_batch`` per call. Over shared memory the slots are the stored bytes
        themselves, held under a lease for the duration of the call (nothing is copied
        on the way): ``read`` copies out what it needs and must not keep the slot. A
        block may be handed over twice (a lease that expired while reading is read
        again; a block the server could not place in shared memory comes over gRPC in a
        later call), so ``read`` must be idempotent per index. With ``verify`` each slot
        is checked against its descriptor's checksum after ``read``: a mismatch makes the
        block missing (0) and is reported to the server, which drops the corrupt copy
        (pass False only when ``read`` verifies the bytes itself: against
        ``slot.checksum``, returning the indices that failed, which are made missing and
        reported the same way)."""
        return self._get_in_place(namespace, hashes, read, max_batch, defer=False,
                                  verify=verify).sizes

    def lease_in_place(self, namespace: str, hashes: Sequence[bytes], read: SlotCallback, *,
                       max_batch: int = 256, verify: bool = True) -> LeaseRead:
        """:meth:`get_in_place` with the leases released in the background: the call
        returns once ``read`` is done. ``confirm()`` on the result waits for the
        releases and raises LeaseExpired if a lease ended before its release (what was
        read may have been overwritten: read again or discard it)."""
        return self._get_in_place(namespace, hashes, read, max_batch, defer=True,
                                  verify=verify)

    def _checksums(self, views: Sequence[memoryview]) -> list[int]:
        """xxh3-64 of each view; large ones split between this thread and the call
        threads (xxhash lets go of the GIL: measured here, four 8 MiB slots hashed in
        1.47 ms on one thread, 1.04 ms on two)."""
        if len(views) < 2 or sum(len(v) for v in views) < PARALLEL_HASH_BYTES:
            return [xxhash.xxh3_64_intdigest(v) for v in views]
        half = len(views) // 2
        rest = [self._background(functools.partial(xxhash.xxh3_64_intdigest, v))
                for v in views[half:]]
        return [xxhash.xxh3_64_intdigest(v) for v in views[:half]] + [r() for r in rest]

    def _get_in_place(self, namespace: str, hashes: Sequence[bytes], read: SlotCallback,
                      max_batch: int, defer: bool, verify: bool = True) -> LeaseRead:
        if max_batch < 1:
            raise InvalidArgument(f"get_in_place: max_batch must be >= 1, got {max_batch}")
        hashes = [bytes(h) for h in hashes]
        result = LeaseRead()
        chunks = [(i, hashes[i:i + max_batch]) for i in range(0, len(hashes), max_batch)]
        if not self.uses_shared_memory:
            for i, chunk in chunks:
                found = self._get_grpc(namespace, chunk)
                present = [(i + j, SlotBuffer(memoryview(b.payload), 0, len(b.payload)))
                           for j, b in enumerate(found) if b is not None]
                if present:
                    read(present)
                result.sizes += [len(b.payload) if b is not None else 0 for b in found]
            return result
        # The next batch is acquired while this one is read (the server pins and
        # places it meanwhile); with deferred releases nothing else waits in between.
        ahead: Callable[[], pb.AcquireResponse] | None = None
        try:
            for k, (i, chunk) in enumerate(chunks):
                resp = ahead() if ahead is not None else None
                ahead = None
                if defer and k + 1 < len(chunks):
                    ahead = self._acquire_async(namespace, chunks[k + 1][1])
                result.sizes += self._read_in_place(namespace, chunk, read, i, result, defer,
                                                    resp=resp, verify=verify)
        except BaseException:
            if ahead is not None:  # release the lease taken ahead now
                with contextlib.suppress(Exception):
                    lease = ahead().lease_id
                    self._call(self._stub.Release, pb.ReleaseRequest(lease_id=lease))
            raise
        return result

    def _acquire_async(self, namespace: str, hashes: list[bytes]
                       ) -> Callable[[], pb.AcquireResponse]:
        request = pb.AcquireRequest(namespace=namespace, block_hashes=hashes)
        return self._background(lambda: self._call(self._stub.Acquire, request))

    def _read_in_place(self, namespace: str, hashes: list[bytes], read: SlotCallback, base: int,
                       result: LeaseRead, defer: bool, retries: int = 1,
                       resp: pb.AcquireResponse | None = None, verify: bool = True
                       ) -> list[int]:
        if resp is None:
            resp = self._call(self._stub.Acquire,
                              pb.AcquireRequest(namespace=namespace, block_hashes=hashes))
        slots, sizes, overflow = acquired_slots(resp, self._segments)
        release = pb.ReleaseRequest(lease_id=resp.lease_id)
        try:
            if slots:
                # a reader that checked the bytes itself says which did not match
                for j in read([(base + i, slot) for i, slot in slots]) or ():
                    i = j - base
                    if 0 <= i < len(sizes) and sizes[i]:
                        sizes[i] = 0
                        release.corrupt_hashes.append(bytes(resp.headers[i].block_hash))
                if verify:  # what read took is good only if the slot still matches now
                    digests = self._checksums([slot.view() for _, slot in slots])
                    for (i, _), digest in zip(slots, digests, strict=True):
                        if digest != resp.slots[i].checksum:
                            sizes[i] = 0
                            release.corrupt_hashes.append(bytes(resp.headers[i].block_hash))
        except BaseException:
            with contextlib.suppress(KVStoreError):  # the lease ends by the server's clock
                self._call(self._stub.Release, release)
            raise
        if defer:
            result.releases.append(self._background(lambda: self._call(self._stub.Release,
                                                                       release)))
        else:
            try:
                self._call(self._stub.Release, release)
            except LeaseExpired:
                if retries <= 0:
                    raise
                # What was read may have been overwritten: read it all again.
                return self._read_in_place(namespace, hashes, read, base, result, defer,
                                           retries - 1)
        if overflow:
            rest = self._get_grpc(namespace, [hashes[i] for i in overflow])
            late = [(base + i, SlotBuffer(memoryview(b.payload), 0, len(b.payload)))
                    for i, b in zip(overflow, rest, strict=True) if b is not None]
            if late:
                read(late)
            for i, b in zip(overflow, rest, strict=True):
                sizes[i] = len(b.payload) if b is not None else 0
        return sizes
