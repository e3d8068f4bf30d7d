"""The blocking client. Uses the shared-memory plane when the server is on this
host and its segments attach; gRPC streaming otherwise."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from kvstore.client._common import (
    READ_BATCH,
    BlockSink,
    BlockSpec,
    LookupResult,
    PayloadSink,
    Stats,
    block_from_pb,
    copy_bytes,
    copy_into,
    fill_overflow,
    lookup_request,
    put_requests,
    read_acquired,
    tags,
    translate,
)
from kvstore.client.held import Renewer
from kvstore.client.holding import Holding
from kvstore.client.inplace import PARALLEL_HASH_BYTES
from kvstore.client.probe import probe_failed, use_segments
from kvstore.client.segments import SegmentCache, SlotBuffer
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.security.client import ClientSecurity
from kvstore.types import BlockData

if TYPE_CHECKING:
    from kvstore.profile.model import Profile

__all__ = ["KVStoreClient"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_MAX_MESSAGE = 256 * 2**20


class KVStoreClient(Holding):
    """``KVStoreClient("127.0.0.1:50051")``; a context manager; thread-safe for calls.

    ``shared_memory``: ``None`` = use it when the server is on this host,
    ``False`` = always gRPC, ``True`` = require it.
    """

    def __init__(self, address: str = "127.0.0.1:50051", *, timeout: float = 30.0,
                 shared_memory: bool | None = None, token: str | None = None,
                 security: ClientSecurity | None = None) -> None:
        self.address = address
        self.timeout = timeout
        #: Token and TLS: ``security``, else the environment (``KVSTORE_TOKEN``,
        #: ``KVSTORE_TLS_*``); ``token`` replaces the token of either.
        sec = security if security is not None else ClientSecurity.from_env()
        self.security = sec if token is None else sec.merged(token=token)
        self._channel = self.security.channel(address, options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ])
        self._stub = pb_grpc.KVStoreStub(self._channel)
        self._want_shm = shared_memory
        self._shm: bool | None = None
        self._segments = SegmentCache()
        #: whether the server takes Commit's packed form (its Segments answer says)
        self._packed_commit = False
        self._probe_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        #: Renews the leases of reads held in place while their views are held.
        self._renewer = Renewer()

    # -- plumbing -----------------------------------------------------------------
    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, timeout=self.timeout, **kwargs)
        except grpc.RpcError as exc:
            raise translate(exc, self.address) from exc

    @property
    def uses_shared_memory(self) -> bool:
        if self._shm is None:
            with self._probe_lock:
                if self._shm is None:
                    self._shm = self._probe_shm()
        return self._shm

    def _probe_shm(self) -> bool:
        if self._want_shm is False:
            return False
        try:
            resp = self._call(self._stub.Segments, pb.SegmentsRequest())
        except (KVStoreError, OSError) as exc:
            return probe_failed(self.address, exc, self._want_shm)
        self._packed_commit = resp.packed_commit
        return use_segments(self.address, resp, self._segments, self._want_shm)

    # -- the API --------------------------------------------------------------------
    def put(self, namespace: str, blocks: Sequence[BlockData], session_id: str | None = None,
            workload: str | None = None, *, request_id: str | None = None) -> int:
        """Store blocks; returns how many were new. ``request_id``: the request they
        belong to (looked up before), whose plan says where they go."""
        if not self.uses_shared_memory:
            return int(self._call(self._stub.Put, put_requests(
                namespace, blocks, tags(session_id, workload, request_id))).stored)
        specs = [BlockSpec(b.block_hash, b.parent_hash, tuple(b.token_ids), len(b.payload))
                 for b in blocks]
        # The copies let go of the GIL where call threads work beside them (a put this
        # large is pipelined or hashed in chunks on them: ``put_in_place``).
        unlocked = sum(s.size for s in specs) >= PARALLEL_HASH_BYTES

        def fill(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
            for i, slot in batch:
                region = slot.view()
                copy_bytes(region, blocks[i].payload, unlocked)
                region.release()

        return self.put_in_place(namespace, specs, fill, session_id, workload,
                                 request_id=request_id)

    def lookup(self, namespace: str, hashes: Sequence[bytes], session_id: str | None = None,
               workload: str | None = None, *, request_id: str | None = None,
               num_tokens: int = 0, then: str | None = None, tool: str | None = None,
               expected_gap_ms: float | None = None,
               num_computed_tokens: int | None = None) -> LookupResult:
        """The longest stored prefix worth loading. ``request_id`` makes repeated lookups
        of one request count once and ties its later puts and hint to it. ``then`` (the
        hint event the turn will end with), ``tool`` and ``expected_gap_ms`` let the
        policy decide the request's HBM keep (``LookupResult.keep_ms``);
        ``num_computed_tokens``, the prompt tokens the engine's own prefix cache holds
        (None: unknown), lets it judge what a keep gained past those."""
        resp = self._call(self._stub.Lookup, lookup_request(
            namespace, hashes, session_id, workload, request_id, num_tokens, then, tool,
            expected_gap_ms, num_computed_tokens))
        return LookupResult.from_pb(resp)

    def get(self, namespace: str, hashes: Sequence[bytes]) -> list[BlockData | None]:
        """The blocks, in order; ``None`` where a block is not stored."""
        hashes = [bytes(h) for h in hashes]
        if self.uses_shared_memory:
            out: list[BlockData | None] = [None] * len(hashes)

            def keep(i: int, h: pb.BlockHeader, payload: bytes | bytearray | memoryview) -> int:
                out[i] = block_from_pb(h, bytes(payload))
                return len(payload)

            for j, n in enumerate(self._read_shm_batches(namespace, hashes, keep)):
                if not n:
                    out[j] = None  # missing, or failed its checksum after the copy
            return out
        return self._get_grpc(namespace, hashes)

    def _get_grpc(self, namespace: str, hashes: list[bytes]) -> list[BlockData | None]:
        result: list[BlockData | None] = [None] * len(hashes)
        try:
            for msg in self._stub.Get(pb.GetRequest(namespace=namespace, block_hashes=hashes),
                                      timeout=self.timeout):
                for i, blk in zip(msg.indices, msg.blocks, strict=True):
                    result[i] = block_from_pb(blk.header, blk.payload)
        except grpc.RpcError as exc:
            raise translate(exc, self.address) from exc
        return result

    def get_into(self, namespace: str, hashes: Sequence[bytes],
                   buffers: Sequence[Any]) -> list[int]:
        """Copy blocks into caller-owned writable buffers (no allocation per block).

        ``buffers[i]`` receives block ``i`` (anything exporting a writable buffer:
        bytearray, numpy array, mmap). Returns each block's payload length, 0 where
        the block is missing. Raises InvalidArgument if a buffer is too small."""
        if len(buffers) != len(hashes):
            raise InvalidArgument(f"get_into: {len(hashes)} hashes but {len(buffers)} buffers")
        # (the copies let go of the GIL where the next batch's Acquire is in flight)
        unlocked = len(hashes) > READ_BATCH
        return self.get_each(namespace, hashes,
                             lambda i, payload: copy_into(buffers[i], payload, unlocked))

    def get_each(self, namespace: str, hashes: Sequence[bytes], sink: PayloadSink) -> list[int]:
        """Hand each stored block's payload to ``sink(i, payload)``, which copies it where
        it wants (for a caller that sizes its buffer from the payload). On the
        shared-memory path ``payload`` is a view of the slot, valid only during the call
        (the read lease holds it); over gRPC it is the received bytes. ``sink`` returns
        the bytes it took (0: not taken). What it took counts only if the slot still
        matches its checksum afterwards (else the block is missing: a lease that ran out
        while the sink was slow makes a miss, never wrong bytes). Returns that per
        block, 0 where the block is missing."""
        hashes = [bytes(h) for h in hashes]
        if not self.uses_shared_memory:
            return [sink(i, b.payload) if b else 0
                    for i, b in enumerate(self._get_grpc(namespace, hashes))]
        return self._read_shm_batches(namespace, hashes,
                                      lambda j, _h, payload: sink(j, payload))

    def _read_shm_batches(self, namespace: str, hashes: list[bytes], sink: BlockSink
                          ) -> list[int]:
        """:meth:`_read_shm` of ``hashes`` READ_BATCH at a time, the next batch's
        Acquire in flight on a call thread while this one is read (the server pins and
        places it meanwhile: the copy here and the server's work overlap, instead of
        adding up). Returns payload sizes (0 = missing)."""
        chunks = [hashes[i:i + READ_BATCH] for i in range(0, len(hashes), READ_BATCH)]
        sizes: list[int] = []
        ahead: Callable[[], pb.AcquireResponse] | None = None
        try:
            for k, chunk in enumerate(chunks):
                resp, ahead = (ahead() if ahead is not None else None), None
                if k + 1 < len(chunks):
                    ahead = self._acquire_async(namespace, chunks[k + 1])
                sizes += self._read_shm(namespace, chunk, sink, k * READ_BATCH, resp)
        except BaseException:
            if ahead is not None:  # the lease taken ahead ends now, not at its expiry
                with contextlib.suppress(Exception):
                    self._release_quietly(pb.ReleaseRequest(lease_id=ahead().lease_id))
            raise
        return sizes

    def _read_shm(self, namespace: str, hashes: list[bytes], sink: BlockSink, base: int = 0,
                  resp: pb.AcquireResponse | None = None) -> list[int]:
        """Read blocks under a lease (``resp``: the Acquire of ``hashes`` already
        answered); ``sink(base + i, header, bytes)`` consumes block i while the lease
        holds. Returns payload sizes (0 = missing)."""
        if resp is None:
            resp = self._call(self._stub.Acquire,
                              pb.AcquireRequest(namespace=namespace, block_hashes=hashes))
        try:
            sizes, overflow, corrupt = read_acquired(resp, self._segments, sink, base)
        except BaseException:  # (a failing sink: the lease ends now, not at its expiry)
            self._release_quietly(pb.ReleaseRequest(lease_id=resp.lease_id))
            raise
        # Every block the sink took was checked against its checksum after it took it:
        # had the lease run out and the slot been reused meanwhile, the block is missing
        # here, never wrong. So the release need not hold up this read: it runs on the
        # call threads (close() waits for it). A corrupt report is sent before
        # returning, so the server has dropped the bad copy when the caller sees a miss.
        release = pb.ReleaseRequest(lease_id=resp.lease_id, corrupt_hashes=corrupt)
        if corrupt:
            self._release_quietly(release)
        else:
            self._background(lambda: self._release_quietly(release))
        if overflow:
            rest = self._get_grpc(namespace, [hashes[i] for i in overflow])
            fill_overflow(sizes, overflow, rest, sink, base)
        return sizes

    def _release_quietly(self, request: pb.ReleaseRequest) -> None:
        try:
            self._call(self._stub.Release, request)
        except Exception as exc:  # an expired lease, the server gone, this client closed
            # (a held read let go late): the lease ends by the server's clock
            log.debug("kvstore: release of lease %d: %s", request.lease_id, exc)

    def delete(self, namespace: str, hashes: Sequence[bytes] = ()) -> int:
        """Delete blocks; no hashes deletes the whole namespace."""
        resp = self._call(self._stub.Delete, pb.DeleteRequest(
            namespace=namespace, block_hashes=[bytes(h) for h in hashes]))
        return int(resp.deleted)

    def retain(self, namespace: str, hashes: Sequence[bytes], ttl_s: float) -> int:
        """Keep the blocks for ``ttl_s`` seconds, softly (evicted after every unretained
        block of their tier, demoted rather than dropped; within the tenant's retention
        quota and the server's ``retention.max_ttl_s``); ``ttl_s`` 0 ends it. Blocks not
        stored yet are protected once stored. Returns how many it protects now."""
        resp = self._call(self._stub.Retain, pb.RetainRequest(
            namespace=namespace, block_hashes=list(map(bytes, hashes)), ttl_s=ttl_s))
        return int(resp.protected)

    def hint(self, session_id: str, event: str, workload: str | None = None,
             tool: str | None = None, expected_gap_ms: float | None = None,
             namespace: str | None = None, *, request_id: str | None = None,
             output_tokens: int | None = None) -> int:
        """Tell the store a turn / session event; returns placement moves scheduled.
        The session is ``session_id`` in ``namespace``, or that of ``request_id``.
        ``output_tokens``: what the finished request generated (for the live profile)."""
        resp = self._call(self._stub.Hint, pb.HintRequest(
            session_id=session_id, event=event, workload=workload or "", tool=tool or "",
            expected_gap_ms=expected_gap_ms or 0.0, namespace=namespace or "",
            request_id=request_id or "", output_tokens=output_tokens or 0))
        return int(resp.moves)

    def prefault(self) -> int:
        """Map the server's shared-memory segments into this process ahead of use
        (a first touch of each page otherwise costs a page fault on the data path);
        returns the bytes mapped, 0 over gRPC. Takes ~0.25 s per GiB: call it from a
        background thread in a long-lived process."""
        return self._segments.prefault() if self.uses_shared_memory else 0

    def prefault_in_background(
        self, start: Callable[[Callable[[], None]], object] | None = None
    ) -> None:
        """:meth:`prefault` on a background thread (a daemon thread, or what ``start``
        makes of the function), logging what it mapped: for a long-lived process that
        connects now and moves blocks later (the vLLM and LMCache connectors)."""

        def run() -> None:
            started = time.monotonic()
            try:
                nbytes = self.prefault()
            except Exception as exc:  # the data path works without it, only slower
                log.info("kvstore: could not prefault the shared memory: %s", exc)
                return
            if nbytes:
                log.info("kvstore: mapped %.1f GiB of the sidecar's shared memory in %.1f s",
                         nbytes / 2**30, time.monotonic() - started)

        if start is None:
            threading.Thread(target=run, name="kvstore-prefault", daemon=True).start()
        else:
            start(run)

    def stats(self) -> Stats:
        return Stats.from_pb(self._call(self._stub.Stats, pb.StatsRequest()))

    def profile(self) -> Profile:
        """The server's live workload profile (see :mod:`kvstore.profile.live`)."""
        from kvstore.profile.wire import from_pb

        return from_pb(self._call(self._stub.Profile, pb.ProfileRequest()), self.address)

    def close(self) -> None:
        self._renewer.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._segments.close()
        self._channel.close()

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
