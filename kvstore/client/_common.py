"""What the sync and async clients share: message building, copies out of acquired
slots and error translation. No I/O on the network here; the mapping of the server's
segments is :mod:`kvstore.client.segments`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import xxhash

from kvstore import errors
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.client.segments import SegmentCache, SlotBuffer
from kvstore.errors import InvalidArgument, KVStoreError, Unavailable
from kvstore.types import BlockData, Medium

__all__ = [
    "BlockSpec",
    "LeaseRead",
    "LookupResult",
    "PayloadSink",
    "SlotCallback",
    "Stats",
    "batches",
    "commit_request",
    "copy_bytes",
    "tags",
    "translate",
]

_MEDIA = {pb.MEDIUM_GPU: Medium.GPU, pb.MEDIUM_CPU: Medium.CPU, pb.MEDIUM_DISK: Medium.DISK,
          pb.MEDIUM_REMOTE: Medium.REMOTE}

#: Consumes one block read under a lease: (index, header, payload) -> payload size.
BlockSink = Callable[[int, pb.BlockHeader, "bytes | bytearray | memoryview"], int]
#: The public form (``get_each``): (index, payload) -> bytes taken, 0 = not taken.
PayloadSink = Callable[[int, "bytes | bytearray | memoryview"], int]


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """A block to store in place: its key and chain, and the payload size it will have."""

    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    size: int


#: Reads or writes a batch of blocks in place: ``(index in the call, where it lies)``.
#: Gets ``(i, slot)`` pairs. A reader that checks the bytes itself (``verify=False``)
#: returns the indices ``i`` whose bytes failed its check (None: all good): those
#: blocks count as missing and are reported to the server, which drops the copy.
SlotCallback = Callable[[Sequence[tuple[int, SlotBuffer]]], "Collection[int] | None"]


@dataclass(slots=True)
class LeaseRead:
    """Blocks read in place (``sizes``: payload length per hash, 0 = missing) whose
    leases may still be being released (``lease_in_place``)."""

    sizes: list[int] = field(default_factory=list)
    releases: list[Callable[[], Any]] = field(default_factory=list)

    def confirm(self) -> None:
        """Wait for the releases; raises LeaseExpired if a lease ended before its
        release, i.e. what was read under it may have been overwritten."""
        errors = []
        for release in self.releases:
            try:
                release()
            except KVStoreError as exc:
                errors.append(exc)
        self.releases.clear()
        if errors:
            raise errors[0]

#: Blocks per shared-memory batch (one Reserve/Commit pair), bounded by bytes too.
BATCH_BYTES = 32 * 2**20
BATCH_BLOCKS = 256
#: Blocks per in-place put's Reserve/Commit pair (``put_in_place``): a request's
#: blocks in one pair up to these bounds (a vLLM request's save, 127 x 768 KiB, is
#: one); a larger put is pipelined in pairs of this size (the server reserves and
#: commits one while the client copies the next).
RESERVE_BYTES = 128 * 2**20
RESERVE_BLOCKS = 1024
#: Blocks per shared-memory read's Acquire (``get`` / ``get_into`` / ``get_each``):
#: the next batch's Acquire is in flight while one is read.
READ_BATCH = 256
#: Bytes per gRPC Put message: measured on loopback, 1 MiB messages stream ~4x
#: faster than 16 MiB ones (grpc's flow control and copies favour small frames).
GRPC_MESSAGE_BYTES = 2**20


@dataclass(frozen=True, slots=True)
class LookupResult:
    """``num_hit`` leading blocks are stored; ``media[i]`` is the fastest tier of block i.
    ``store_blocks``: how many blocks after those the request should offer to store (the
    policy admits them, or holds them already); the ones past them would be refused."""

    num_hit: int
    media: tuple[Medium, ...]
    store_blocks: int = 0
    #: HBM keep the policy decided: how long to hold the request's blocks in the
    #: engine's own cache after it ends (0: release them).
    keep_ms: float = 0.0

    @classmethod
    def from_pb(cls, resp: pb.LookupResponse) -> LookupResult:
        return cls(resp.num_hit, tuple(map(_MEDIA.__getitem__, resp.media)), resp.store_blocks,
                   resp.keep_ms)


@dataclass(frozen=True, slots=True)
class TierStat:
    name: str
    medium: Medium
    capacity_bytes: int
    used_bytes: int
    blocks: int
    hits: int
    evictions: int


@dataclass(frozen=True, slots=True)
class QuotaStat:
    """A quota's limit and what its tenant holds in one tier."""

    namespace_prefix: str
    tier: str
    limit_bytes: int
    used_bytes: int
    evictions: int
    refused: int


@dataclass(frozen=True, slots=True)
class RetentionStat:
    """What a tenant (its quota prefix, or the namespace) retains in one tier."""

    tenant: str
    tier: str
    retained_bytes: int
    limit_bytes: int


@dataclass(frozen=True, slots=True)
class Stats:
    tiers: tuple[TierStat, ...]
    blocks: int
    namespaces: int
    lookups: int
    lookup_hit_blocks: int
    lookup_miss_blocks: int
    puts: int
    gets: int
    bytes_in: int
    bytes_out: int
    pending_moves: int
    events_published: int
    version: str
    transfers_failed: int = 0
    transfers_dropped: int = 0
    events_dropped: int = 0
    corrupt_reads: int = 0
    orphans_dropped: int = 0
    demotions_failed: int = 0
    startup_skipped: int = 0
    quarantined_slots: int = 0
    policy: str = ""
    #: Every quota for an admin; a tenant's own quotas for a tenant.
    quotas: tuple[QuotaStat, ...] = ()
    #: Retained bytes per (tenant, tier), and the retention counters.
    retention: tuple[RetentionStat, ...] = ()
    retained_granted: int = 0
    retained_refused: int = 0
    retained_returned: int = 0
    retained_evicted: int = 0

    @classmethod
    def from_pb(cls, r: pb.StatsResponse) -> Stats:
        return cls(
            tiers=tuple(TierStat(t.name, _MEDIA[t.medium], t.capacity_bytes, t.used_bytes,
                                 t.blocks, t.hits, t.evictions) for t in r.tiers),
            blocks=r.blocks, namespaces=r.namespaces, lookups=r.lookups,
            lookup_hit_blocks=r.lookup_hit_blocks, lookup_miss_blocks=r.lookup_miss_blocks,
            puts=r.puts, gets=r.gets, bytes_in=r.bytes_in, bytes_out=r.bytes_out,
            pending_moves=r.pending_moves, events_published=r.events_published,
            version=r.version, transfers_failed=r.transfers_failed,
            transfers_dropped=r.transfers_dropped, events_dropped=r.events_dropped,
            corrupt_reads=r.corrupt_reads, orphans_dropped=r.orphans_dropped,
            demotions_failed=r.demotions_failed, startup_skipped=r.startup_skipped,
            quarantined_slots=r.quarantined_slots, policy=r.policy,
            quotas=tuple(QuotaStat(q.namespace_prefix, q.tier, q.limit_bytes, q.used_bytes,
                                   q.evictions, q.refused) for q in r.quotas),
            retention=tuple(RetentionStat(u.tenant, u.tier, u.retained_bytes, u.limit_bytes)
                            for u in r.retention),
            retained_granted=r.retained_granted, retained_refused=r.retained_refused,
            retained_returned=r.retained_returned, retained_evicted=r.retained_evicted,
        )

    def tier(self, name: str) -> TierStat:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)


def header(b: BlockData | BlockSpec, size: int) -> pb.BlockHeader:
    return pb.BlockHeader(block_hash=bytes(b.block_hash), parent_hash=bytes(b.parent_hash or b""),
                          token_ids=list(b.token_ids), size=size)


def commit_request(namespace: str, slots: Sequence[pb.SlotDescriptor], checksums: Sequence[int],
                   headers: Sequence[pb.BlockHeader], t: dict[str, str], packed: bool
                   ) -> pb.CommitRequest:
    """The Commit of written ``slots`` (as Reserve returned them) with the writer's
    checksum of each: ``packed`` (a server that takes it, ``SegmentsResponse.packed_commit``)
    by slot id alone, in two packed arrays; else as descriptors carrying the checksums."""
    request = pb.CommitRequest(namespace=namespace, session_id=t["session_id"],
                               workload=t["workload"], request_id=t["request_id"])
    request.headers.extend(headers)
    if packed:
        request.slot_ids.extend([d.slot_id for d in slots])
        request.checksums.extend(checksums)
        return request
    for d, digest in zip(slots, checksums, strict=True):
        d.checksum = digest
    request.slots.extend(slots)
    return request


def batch_bounds(sizes: Sequence[int], max_bytes: int = BATCH_BYTES,
                 max_blocks: int = BATCH_BLOCKS) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of batches of at most max_blocks blocks / ~max_bytes bytes."""
    start, size = 0, 0
    for i, n in enumerate(sizes):
        if i > start and (size + n > max_bytes or i - start >= max_blocks):
            yield start, i
            start, size = i, 0
        size += n
    if start < len(sizes):
        yield start, len(sizes)


def batches(blocks: Sequence[BlockData], max_bytes: int = BATCH_BYTES,
            max_blocks: int = BATCH_BLOCKS) -> Iterator[Sequence[BlockData]]:
    """Split into batches of at most max_blocks blocks / ~max_bytes bytes."""
    for start, end in batch_bounds([len(b.payload) for b in blocks], max_bytes, max_blocks):
        yield blocks[start:end]


def tags(session_id: str | None, workload: str | None, request_id: str | None
         ) -> dict[str, str]:
    """The request fields Put, Reserve and Commit carry alike."""
    return {"session_id": session_id or "", "workload": workload or "",
            "request_id": request_id or ""}


def lookup_request(namespace: str, hashes: Sequence[bytes], session_id: str | None,
                   workload: str | None, request_id: str | None, num_tokens: int,
                   then: str | None, tool: str | None, expected_gap_ms: float | None,
                   num_computed_tokens: int | None, *, hold: bool = False,
                   lease_seconds: float = 0.0) -> pb.LookupRequest:
    """The one ``LookupRequest`` every client's lookup sends (``lookup`` of both
    clients, ``lookup_and_hold``): what the turn ends with (``then``, ``tool``,
    ``expected_gap_ms``) and what the engine holds (``num_computed_tokens``, None:
    unknown) reach the policy whichever form asked."""
    return pb.LookupRequest(
        namespace=namespace, block_hashes=list(map(bytes, hashes)),
        session_id=session_id or "", workload=workload or "",
        request_id=request_id or "", num_tokens=num_tokens, then=then or "",
        tool=tool or "", expected_gap_ms=expected_gap_ms or 0.0,
        num_computed_tokens=num_computed_tokens, hold=hold, lease_seconds=lease_seconds)


def put_requests(namespace: str, blocks: Sequence[BlockData], tags: dict[str, str]
                 ) -> Iterator[pb.PutRequest]:
    for batch in batches(blocks, GRPC_MESSAGE_BYTES):
        yield pb.PutRequest(
            namespace=namespace, **tags,
            blocks=[pb.Block(header=header(b, len(b.payload)), payload=bytes(b.payload))
                    for b in batch])


#: Copies of at least this many bytes let go of the GIL (:func:`copy_bytes`).
UNLOCKED_COPY_BYTES = 32 * 2**10


def copy_bytes(dst: memoryview, src: bytes | bytearray | memoryview, unlocked: bool = True
               ) -> None:
    """``dst[:] = src`` for a byte view ``dst`` of ``len(src)`` bytes; ``unlocked``: letting
    go of the GIL for a large copy, for a caller whose call threads have work meanwhile.

    A memoryview's slice assignment holds the GIL for the whole copy, so the client's
    call threads (the next batch's Acquire or Reserve, a Commit's reply, a chunk's
    hashing) waited up to the interpreter's switch interval (5 ms) for each turn:
    measured here, reading 2,048 x 64 KiB blocks with the next Acquire in flight, the
    reader waited 3-4 ms a batch of 256 for a reply the server had sent. numpy's copy
    lets go of it; alone it is 7-13% slower than the slice's memcpy (measured here, 1 MiB
    and 64 KiB blocks out of cache), so a copy with nothing beside it keeps the slice."""
    if unlocked and len(src) >= UNLOCKED_COPY_BYTES:
        np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
    else:
        dst[:] = src


def copy_into(dst: Any, src: bytes | bytearray | memoryview, unlocked: bool = True) -> int:
    """Copy ``src`` into the start of writable buffer ``dst``; returns len(src)
    (``unlocked``: see :func:`copy_bytes`)."""
    view = memoryview(dst).cast("B")
    n = len(src)
    if view.nbytes < n:
        raise InvalidArgument(f"get_into: a buffer of {view.nbytes} bytes is too small for a "
                              f"block of {n} bytes")
    copy_bytes(view[:n], src, unlocked)
    return n


def block_from_pb(h: pb.BlockHeader, payload: bytes) -> BlockData:
    return BlockData(h.block_hash, h.parent_hash or None, tuple(h.token_ids), payload)


def acquired_slots(resp: pb.AcquireResponse, segments: SegmentCache
                   ) -> tuple[list[tuple[int, SlotBuffer]], list[int], list[int]]:
    """Where each block an Acquire placed in shared memory lies: ``(i, slot)`` pairs,
    payload sizes (0: missing) and the indices of blocks stored but not in shared
    memory now, to be read over gRPC (:func:`fill_overflow`)."""
    slots: list[tuple[int, SlotBuffer]] = []
    sizes: list[int] = []
    overflow: list[int] = []
    for i, (d, h) in enumerate(zip(resp.slots, resp.headers, strict=True)):
        sizes.append(int(d.length))
        if not d.length:
            if h.block_hash:
                overflow.append(i)
            continue
        slots.append((i, segments.slot(d)))
    return slots, sizes, overflow


def read_acquired(resp: pb.AcquireResponse, segments: SegmentCache, sink: BlockSink,
                  base: int) -> tuple[list[int], list[int], list[bytes]]:
    """Hand each block an Acquire placed in shared memory to ``sink`` (while the lease
    holds), then check the slot against the checksum in its descriptor: a mismatch
    makes the block missing (size 0, whatever the sink did with it) and reported.
    Returns the payload sizes (0: missing), the indices of blocks stored but not in
    shared memory now, to be read over gRPC (:func:`fill_overflow`), and the hashes
    of the corrupt ones (to report in Release)."""
    slots, sizes, overflow = acquired_slots(resp, segments)
    corrupt: list[bytes] = []
    for i, slot in slots:
        region = slot.view()
        try:
            n = sink(base + i, resp.headers[i], region)
            # Checked after the copy: what the sink took is good only if the slot
            # still holds the block's bytes now.
            if xxhash.xxh3_64_intdigest(region) != resp.slots[i].checksum:
                n = 0
                corrupt.append(bytes(resp.headers[i].block_hash))
            sizes[i] = n
        finally:
            region.release()
    return sizes, overflow, corrupt


def fill_overflow(sizes: list[int], overflow: Sequence[int],
                  blocks: Sequence[BlockData | None], sink: BlockSink, base: int) -> None:
    """Hand the blocks read over gRPC for ``overflow`` to ``sink``, updating ``sizes``."""
    for i, blk in zip(overflow, blocks, strict=True):
        if blk is not None:
            sizes[i] = sink(base + i, header(blk, len(blk.payload)), blk.payload)


def translate(exc: grpc.RpcError, address: str) -> KVStoreError:
    """A grpc error as our exception, keeping the server's class when it sent one."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    kind = ""
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for k, v in trailers or ():
        if k == "kvstore-error":
            kind = v if isinstance(v, str) else v.decode()
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, KVStoreError):
        return cls(details)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(f"kvstore server at {address} unreachable: {details}")
    return errors.error_for_status(code.name if code else "UNKNOWN", details or str(exc))
