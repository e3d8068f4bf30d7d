"""The asyncio client: the same surface as :class:`KVStoreClient`, awaitable."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import xxhash

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from kvstore.client._common import (
    READ_BATCH,
    RESERVE_BLOCKS,
    RESERVE_BYTES,
    BlockSink,
    LookupResult,
    PayloadSink,
    Stats,
    batches,
    block_from_pb,
    commit_request,
    copy_bytes,
    copy_into,
    fill_overflow,
    header,
    lookup_request,
    put_requests,
    read_acquired,
    tags,
    translate,
)
from kvstore.client.probe import probe_failed, use_segments
from kvstore.client.segments import SegmentCache
from kvstore.errors import InvalidArgument, KVStoreError, TierFull
from kvstore.security.client import ClientSecurity
from kvstore.types import BlockData

if TYPE_CHECKING:
    from kvstore.profile.model import Profile

__all__ = ["AsyncKVStoreClient"]


def _done(n: int) -> asyncio.Future[int]:
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    fut.set_result(n)
    return fut

log = logging.getLogger(__name__)

_MAX_MESSAGE = 256 * 2**20


class AsyncKVStoreClient:
    """``async with AsyncKVStoreClient("127.0.0.1:50051") as c: await c.put(...)``."""

    def __init__(self, address: str = "127.0.0.1:50051", *, timeout: float = 30.0,
                 shared_memory: bool | None = None, token: str | None = None,
                 security: ClientSecurity | None = None) -> None:
        self.address = address
        self.timeout = timeout
        #: Token and TLS: ``security``, else the environment (``KVSTORE_TOKEN``,
        #: ``KVSTORE_TLS_*``); ``token`` replaces the token of either.
        sec = security if security is not None else ClientSecurity.from_env()
        self.security = sec if token is None else sec.merged(token=token)
        self._channel = self.security.aio_channel(address, options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ])
        self._stub = pb_grpc.KVStoreStub(self._channel)
        self._want_shm = shared_memory
        self._shm: bool | None = None
        self._segments = SegmentCache()
        #: whether the server takes Commit's packed form (its Segments answer says)
        self._packed_commit = False
        #: Releases of verified reads, sent without waiting (close() awaits them).
        self._releases: set[asyncio.Task[None]] = set()

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise translate(exc, self.address) from exc

    def _started(self, method: Any, request: Any) -> Coroutine[Any, Any, Any]:
        """:meth:`_call` started now: grpc's task for the call exists on return (the
        request goes out at the loop's next turn, whether or not the result is awaited
        by then); await the returned coroutine for the reply."""
        call = method(request, timeout=self.timeout)

        async def reply() -> Any:
            try:
                return await call
            except grpc.RpcError as exc:
                raise translate(exc, self.address) from exc

        return reply()

    async def uses_shared_memory(self) -> bool:
        if self._shm is None:
            self._shm = await self._probe_shm()
        return self._shm

    async def _probe_shm(self) -> bool:
        if self._want_shm is False:
            return False
        try:
            resp = await self._call(self._stub.Segments, pb.SegmentsRequest())
        except (KVStoreError, OSError) as exc:
            return probe_failed(self.address, exc, self._want_shm)
        self._packed_commit = resp.packed_commit
        return use_segments(self.address, resp, self._segments, self._want_shm)

    async def put(self, namespace: str, blocks: Sequence[BlockData],
                  session_id: str | None = None, workload: str | None = None, *,
                  request_id: str | None = None) -> int:
        t = tags(session_id, workload, request_id)
        if await self.uses_shared_memory():
            # One Reserve/Commit pair per RESERVE_BYTES / RESERVE_BLOCKS; past that,
            # pipelined: the server commits batch k while we write k+1.
            stored = 0
            pending: asyncio.Future[int] | None = None
            for batch in batches(blocks, RESERVE_BYTES, RESERVE_BLOCKS):
                commit = await self._put_shm(namespace, batch, t)
                if pending is not None:
                    stored += await pending
                pending = commit
            return stored + (await pending if pending is not None else 0)

        async def requests() -> AsyncIterator[pb.PutRequest]:
            for r in put_requests(namespace, blocks, t):
                yield r

        try:
            resp = await self._stub.Put(requests(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise translate(exc, self.address) from exc
        return int(resp.stored)

    async def _put_shm(self, namespace: str, blocks: Sequence[BlockData], t: dict[str, str]
                       ) -> asyncio.Future[int]:
        """Reserve and write one batch; returns a future of its commit."""
        try:
            resv = await self._call(self._stub.Reserve, pb.ReserveRequest(
                namespace=namespace, sizes=[len(b.payload) for b in blocks],
                block_hashes=[bytes(b.block_hash) for b in blocks], **t))
        except TierFull:
            if len(blocks) == 1:
                raise
            # The batch is larger than what the tier can hold at once: halve it.
            half = len(blocks) // 2
            n = await (await self._put_shm(namespace, blocks[:half], t))
            n += await (await self._put_shm(namespace, blocks[half:], t))
            return _done(n)
        slots, digests, headers = [], [], []
        try:
            for b, d in zip(blocks, resv.slots, strict=True):
                if not d.slot_id:
                    continue
                region = self._segments.region(d)
                copy_bytes(region, b.payload, unlocked=False)  # (no call thread beside it)
                region.release()
                digests.append(xxhash.xxh3_64_intdigest(b.payload))  # recorded by the server
                slots.append(d)
                headers.append(header(b, len(b.payload)))
        except BaseException:
            ids = [d.slot_id for d in resv.slots if d.slot_id]
            if ids:
                await self._call(self._stub.Abort, pb.AbortRequest(slot_ids=ids))
            raise
        if not slots:
            return _done(0)
        request = commit_request(namespace, slots, digests, headers, t, self._packed_commit)

        async def commit() -> int:
            return int((await self._call(self._stub.Commit, request)).stored)

        return asyncio.ensure_future(commit())

    async def lookup(self, namespace: str, hashes: Sequence[bytes],
                     session_id: str | None = None, workload: str | None = None, *,
                     request_id: str | None = None, num_tokens: int = 0,
                     then: str | None = None, tool: str | None = None,
                     expected_gap_ms: float | None = None,
                     num_computed_tokens: int | None = None) -> LookupResult:
        resp = await self._call(self._stub.Lookup, lookup_request(
            namespace, hashes, session_id, workload, request_id, num_tokens, then, tool,
            expected_gap_ms, num_computed_tokens))
        return LookupResult.from_pb(resp)

    async def get(self, namespace: str, hashes: Sequence[bytes]) -> list[BlockData | None]:
        hashes = [bytes(h) for h in hashes]
        if await self.uses_shared_memory():
            out: list[BlockData | None] = [None] * len(hashes)

            def keep(i: int, h: pb.BlockHeader, payload: bytes | bytearray | memoryview) -> int:
                out[i] = block_from_pb(h, bytes(payload))
                return len(payload)

            for j, n in enumerate(await self._read_shm_batches(namespace, hashes, keep)):
                if not n:
                    out[j] = None  # missing, or failed its checksum after the copy
            return out
        return await self._get_grpc(namespace, hashes)

    async def _get_grpc(self, namespace: str, hashes: list[bytes]) -> list[BlockData | None]:
        result: list[BlockData | None] = [None] * len(hashes)
        try:
            async for msg in self._stub.Get(
                    pb.GetRequest(namespace=namespace, block_hashes=hashes),
                    timeout=self.timeout):
                for i, blk in zip(msg.indices, msg.blocks, strict=True):
                    result[i] = block_from_pb(blk.header, blk.payload)
        except grpc.RpcError as exc:
            raise translate(exc, self.address) from exc
        return result

    async def get_into(self, namespace: str, hashes: Sequence[bytes],
                   buffers: Sequence[Any]) -> list[int]:
        """Copy blocks into caller-owned writable buffers (no allocation per block).

        ``buffers[i]`` receives block ``i`` (anything exporting a writable buffer:
        bytearray, numpy array, mmap). Returns each block's payload length, 0 where
        the block is missing. Raises InvalidArgument if a buffer is too small."""
        if len(buffers) != len(hashes):
            raise InvalidArgument(f"get_into: {len(hashes)} hashes but {len(buffers)} buffers")
        unlocked = len(hashes) > READ_BATCH  # (see KVStoreClient.get_into)
        return await self.get_each(namespace, hashes,
                                   lambda i, payload: copy_into(buffers[i], payload, unlocked))

    async def get_each(self, namespace: str, hashes: Sequence[bytes],
                       sink: PayloadSink) -> list[int]:
        """Hand each stored block's payload to ``sink(i, payload)`` (see
        :meth:`KVStoreClient.get_each`)."""
        hashes = [bytes(h) for h in hashes]
        if not await self.uses_shared_memory():
            return [sink(i, b.payload) if b else 0
                    for i, b in enumerate(await self._get_grpc(namespace, hashes))]
        return await self._read_shm_batches(namespace, hashes,
                                            lambda j, _h, payload: sink(j, payload))

    async def _read_shm_batches(self, namespace: str, hashes: list[bytes], sink: BlockSink
                                ) -> list[int]:
        """:meth:`_read_shm` of ``hashes`` READ_BATCH at a time, the next batch's
        Acquire sent before this one is read (see ``KVStoreClient._read_shm_batches``).
        Returns payload sizes (0 = missing)."""
        chunks = [hashes[i:i + READ_BATCH] for i in range(0, len(hashes), READ_BATCH)]
        sizes: list[int] = []
        ahead: Coroutine[Any, Any, pb.AcquireResponse] | None = None
        try:
            for k, chunk in enumerate(chunks):
                resp, ahead = (await ahead if ahead is not None else None), None
                if k + 1 < len(chunks):
                    ahead = self._started(self._stub.Acquire, pb.AcquireRequest(
                        namespace=namespace, block_hashes=chunks[k + 1]))
                    await asyncio.sleep(0)  # (its request sent before the copies hold the loop)
                sizes += await self._read_shm(namespace, chunk, sink, k * READ_BATCH, resp)
        except BaseException:
            if ahead is not None:  # the lease taken ahead ends now, not at its expiry
                with contextlib.suppress(Exception):
                    await self._release_quietly(pb.ReleaseRequest(lease_id=(await ahead).lease_id))
            raise
        return sizes

    async def _read_shm(self, namespace: str, hashes: list[bytes], sink: BlockSink, base: int = 0,
                        resp: pb.AcquireResponse | None = None) -> list[int]:
        """Read blocks under a lease (``resp``: the Acquire of ``hashes`` already
        answered); ``sink(base + i, header, bytes)`` consumes block i while the lease
        holds. Returns payload sizes (0 = missing)."""
        if resp is None:
            resp = await self._call(self._stub.Acquire,
                                    pb.AcquireRequest(namespace=namespace, block_hashes=hashes))
        try:
            sizes, overflow, corrupt = read_acquired(resp, self._segments, sink, base)
        except BaseException:  # (a failing sink: the lease ends now, not at its expiry)
            await self._release_quietly(pb.ReleaseRequest(lease_id=resp.lease_id))
            raise
        # Each block the sink took was checked against its checksum afterwards (see
        # KVStoreClient._read_shm): the release need not hold up this read, unless it
        # reports a corrupt copy.
        release = pb.ReleaseRequest(lease_id=resp.lease_id, corrupt_hashes=corrupt)
        if corrupt:
            await self._release_quietly(release)
        else:
            task = asyncio.ensure_future(self._release_quietly(release))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
        if overflow:
            rest = await self._get_grpc(namespace, [hashes[i] for i in overflow])
            fill_overflow(sizes, overflow, rest, sink, base)
        return sizes

    async def _release_quietly(self, request: pb.ReleaseRequest) -> None:
        try:
            await self._call(self._stub.Release, request)
        except KVStoreError as exc:  # an expired lease or a server gone: nothing to undo
            log.debug("kvstore: release of lease %d: %s", request.lease_id, exc)

    async def delete(self, namespace: str, hashes: Sequence[bytes] = ()) -> int:
        resp = await self._call(self._stub.Delete, pb.DeleteRequest(
            namespace=namespace, block_hashes=[bytes(h) for h in hashes]))
        return int(resp.deleted)

    async def retain(self, namespace: str, hashes: Sequence[bytes], ttl_s: float) -> int:
        """See :meth:`kvstore.client.KVStoreClient.retain`."""
        resp = await self._call(self._stub.Retain, pb.RetainRequest(
            namespace=namespace, block_hashes=list(map(bytes, hashes)), ttl_s=ttl_s))
        return int(resp.protected)

    async def hint(self, session_id: str, event: str, workload: str | None = None,
                   tool: str | None = None, expected_gap_ms: float | None = None,
                   namespace: str | None = None, *, request_id: str | None = None,
                   output_tokens: int | None = None) -> int:
        resp = await self._call(self._stub.Hint, pb.HintRequest(
            session_id=session_id, event=event, workload=workload or "", tool=tool or "",
            expected_gap_ms=expected_gap_ms or 0.0, namespace=namespace or "",
            request_id=request_id or "", output_tokens=output_tokens or 0))
        return int(resp.moves)

    async def stats(self) -> Stats:
        return Stats.from_pb(await self._call(self._stub.Stats, pb.StatsRequest()))

    async def profile(self) -> Profile:
        """The server's live workload profile (see :mod:`kvstore.profile.live`)."""
        from kvstore.profile.wire import from_pb

        return from_pb(await self._call(self._stub.Profile, pb.ProfileRequest()), self.address)

    async def close(self) -> None:
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)
        self._segments.close()
        await self._channel.close()

    async def __aenter__(self) -> AsyncKVStoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
