"""The gRPC servicer: translates wire <-> domain and maps errors to statuses.

No logic lives here: every call goes to the engine (or the shared-memory
plane; a Lookup's hold is the engine's too), and every :class:`KVStoreError`
leaves as its own status code with its message plus a ``kvstore-error`` trailer
naming the exception class, so the client re-raises the same type.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc

from kvstore._host import host_id
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.engine.leases import Lease
from kvstore.engine.pace import Pace
from kvstore.errors import (
    FailedPrecondition,
    InvalidArgument,
    KVStoreError,
    ResourceExhausted,
)
from kvstore.policies import Hint
from kvstore.profile.live import LiveProfile
from kvstore.security.server import current_tenant, tenant_owner
from kvstore.security.server import tenant_request_id as _rid
from kvstore.server.convert import (
    MEDIUM_TO_PB,
    add_header,
    add_slot,
    header_to_pb,
    new_block,
    slot_from_pb,
)
from kvstore.server.looplag import LoopLag
from kvstore.server.stats_service import stats_response
from kvstore.tiers.base import Slot
from kvstore.types import BlockMeta

__all__ = ["KVStoreServicer"]

log = logging.getLogger(__name__)

#: Bytes per streamed Get message (small frames stream fastest; see the client).
_GET_CHUNK_BYTES = 2**20
T = TypeVar("T")


#: Longest namespace, session id, workload, tool or event name a request may carry
#: (each is kept with every block or statistic it names).
MAX_NAME_CHARS = 1024
_NAME_FIELDS = ("namespace", "session_id", "workload", "tool", "event")
#: Longest error message sent (UTF-8 bytes): gRPC refuses trailers past 8-16 KiB and
#: the client would get RESOURCE_EXHAUSTED "Stream removed" instead of our status.
_MAX_DETAILS_BYTES = 1024


def check_names(msg: Any) -> None:
    """Refuse a request whose name fields are longer than :data:`MAX_NAME_CHARS`."""
    fields = msg.DESCRIPTOR.fields_by_name
    for name in _NAME_FIELDS:
        if name in fields and len(value := getattr(msg, name)) > MAX_NAME_CHARS:
            raise InvalidArgument(
                f"{name} is {len(value)} characters long; at most {MAX_NAME_CHARS}: "
                f"{value[:40]!r}...")


def _details(exc: KVStoreError) -> str:
    raw = str(exc).encode()
    if len(raw) <= _MAX_DETAILS_BYTES:
        return str(exc)
    cut = raw[:_MAX_DETAILS_BYTES].decode(errors="ignore")
    return f"{cut}... ({len(raw) - _MAX_DETAILS_BYTES} more bytes)"


def _fail(context: grpc.aio.ServicerContext[Any, Any], exc: KVStoreError) -> None:
    """Answer the call with ``exc``'s status, details and class name (the
    ``kvstore-error`` trailer), set on the context: gRPC sends them when the handler
    returns, and drops a unary handler's response. Not ``context.abort``: it raises an
    exception whose traceback and the call's state hold each other, a reference cycle
    per failed call that only the cyclic collector frees (``kvstore.server.heap``)."""
    context.set_trailing_metadata((("kvstore-error", type(exc).__name__),))
    context.set_code(getattr(grpc.StatusCode, exc.status))
    context.set_details(_details(exc))


def _unary(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> T:
        try:
            if hasattr(request, "DESCRIPTOR"):  # (not a Put stream: checked per message)
                check_names(request)
            return await fn(self, request, context)
        except KVStoreError as exc:
            _fail(context, exc)
            return cast(T, None)  # (never sent: the status is not OK)

    return wrapper


def _stream(fn: Callable[..., AsyncIterator[T]]) -> Callable[..., AsyncIterator[T]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[T]:
        try:
            check_names(request)
            async for item in fn(self, request, context):
                yield item
        except KVStoreError as exc:
            _fail(context, exc)  # (sent as the stream's status when it ends here)

    return wrapper


def _owner(context: Any) -> str:
    """Who a reservation or lease belongs to: the caller's tenant and connection."""
    peer = context.peer() if context is not None else ""
    return tenant_owner(peer if isinstance(peer, str) else "")


class KVStoreServicer(pb_grpc.KVStoreServicer):
    def __init__(self, engine: Engine, events: Any = None,
                 profile: LiveProfile | None = None, *, max_put_streams: int = 64,
                 loop_lag: LoopLag | None = None) -> None:
        self.engine = engine
        self.loop_lag = loop_lag
        self.plane = SlotPlane.for_engine(engine)
        self.events = events
        self.host_id = host_id()
        self.max_put_streams = max_put_streams
        self._put_streams = 0
        #: The live workload profile, fed by the engine one line per Lookup / Put /
        #: Commit / Hint (for the Profile RPC).
        self.profile = profile if profile is not None else LiveProfile()
        engine.profile = self.profile

    def _plane(self) -> SlotPlane:
        if self.plane is None:
            raise FailedPrecondition(
                "the shared-memory data plane needs the dram tier (dram.enabled = false); "
                "use the gRPC Put/Get path"
            )
        return self.plane

    @_unary
    async def Lookup(self, request: pb.LookupRequest, context: Any) -> pb.LookupResponse:
        found = await self.engine.serve_lookup(
            request.namespace, list(request.block_hashes), request.session_id,
            request.workload, request_id=_rid(request.request_id),
            num_tokens=request.num_tokens, then=request.then, tool=request.tool,
            expected_gap_s=(request.expected_gap_ms / 1e3 if request.expected_gap_ms
                            else None),
            hold=request.hold, lease_seconds=request.lease_seconds, owner=_owner(context),
            engine_hit_tokens=(request.num_computed_tokens
                               if request.HasField("num_computed_tokens") else None))
        media = found.media
        resp = pb.LookupResponse(num_hit=len(media),
                                 media=([MEDIUM_TO_PB[media[0]]] * len(media)
                                        if media and media.count(media[0]) == len(media)
                                        else list(map(MEDIUM_TO_PB.__getitem__, media))),
                                 store_blocks=found.store, keep_ms=found.keep_s * 1e3)
        if found.held is not None:
            await self._held_to_pb(*found.held, resp.held)
        return resp

    @_unary
    async def Put(self, request_iterator: AsyncIterator[pb.PutRequest], context: Any
                  ) -> pb.PutResponse:
        if self._put_streams >= self.max_put_streams:
            raise ResourceExhausted(
                f"{self.max_put_streams} Put streams are open (server.max_put_streams); "
                "retry later or use the shared-memory path")
        self._put_streams += 1
        try:
            stored = existing = 0
            async for req in request_iterator:
                check_names(req)
                blocks = [new_block(b.header, b.payload, self.engine.max_block_tokens)
                          for b in req.blocks]
                s, e = await self.engine.put(req.namespace, blocks, req.session_id,
                                             req.workload, request_id=_rid(req.request_id))
                stored += s
                existing += e
            return pb.PutResponse(stored=stored, existing=existing)
        finally:
            self._put_streams -= 1

    @_stream
    async def Get(self, request: pb.GetRequest, context: Any) -> AsyncIterator[pb.GetResponse]:
        # One block read at a time: memory stays at about one message however many
        # blocks are asked for.
        msg = pb.GetResponse()
        size = 0
        async for i, meta, payload in self.engine.iter_get(request.namespace,
                                                          list(request.block_hashes)):
            msg.blocks.append(pb.Block(header=header_to_pb(meta), payload=payload))
            msg.indices.append(i)
            size += len(payload)
            if size >= _GET_CHUNK_BYTES:
                yield msg
                msg, size = pb.GetResponse(), 0
        yield msg

    @_unary
    async def Segments(self, request: pb.SegmentsRequest, context: Any) -> pb.SegmentsResponse:
        segs = self._plane().segments()
        return pb.SegmentsResponse(
            segments=[pb.SegmentInfo(name=n, size=s) for n, s in segs], host_id=self.host_id,
            packed_commit=True)

    @_unary
    async def Reserve(self, request: pb.ReserveRequest, context: Any) -> pb.ReserveResponse:
        if len(request.sizes) != len(request.block_hashes):
            raise InvalidArgument(
                f"Reserve: {len(request.sizes)} sizes but {len(request.block_hashes)} hashes")
        slots = await self._plane().reserve(
            request.namespace, list(zip(request.block_hashes, request.sizes, strict=True)),
            owner=_owner(context), session_id=request.session_id, workload=request.workload,
            request_id=_rid(request.request_id))
        resp = pb.ReserveResponse(lease_seconds=self.engine.lease_seconds)
        out = resp.slots
        for s, h in zip(slots, request.block_hashes, strict=True):
            if s:
                add_slot(out, s, h)
            else:
                out.add()
        return resp

    @_unary
    async def Commit(self, request: pb.CommitRequest, context: Any) -> pb.CommitResponse:
        packed = bool(request.slot_ids)
        if packed and request.slots:
            raise InvalidArgument("Commit: send slots or slot_ids, not both")
        n = len(request.slot_ids) if packed else len(request.slots)
        if n != len(request.headers):
            what = "slot_ids" if packed else "slots"
            raise InvalidArgument(
                f"Commit: {n} {what} but {len(request.headers)} headers")
        checksums = list(request.checksums) if packed else [d.checksum for d in request.slots]
        if packed and checksums and len(checksums) != n:
            raise InvalidArgument(f"Commit: {len(checksums)} checksums for {n} slot_ids")
        # (converted between the loop's other calls: ~3.5 us a block, 2 ms for 512)
        slots: list[Slot | int] = list(request.slot_ids) if packed else []
        descriptors = request.slots
        blocks = []
        pace = Pace()
        max_tokens = self.engine.max_block_tokens
        for i, h in enumerate(request.headers):
            if pace.due():
                await pace.pause()
            if not packed:
                slots.append(slot_from_pb(descriptors[i]))
            blocks.append(new_block(h, max_tokens=max_tokens))
        items = list(zip(slots, blocks, strict=True))
        stored = await self._plane().commit(request.namespace, items, request.session_id,
                                            request.workload, owner=_owner(context),
                                            request_id=_rid(request.request_id),
                                            checksums=checksums)
        return pb.CommitResponse(stored=stored)

    @_unary
    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        self._plane().abort(list(request.slot_ids), owner=_owner(context))
        return pb.AbortResponse()

    @_unary
    async def Acquire(self, request: pb.AcquireRequest, context: Any) -> pb.AcquireResponse:
        return await self._acquired(request.namespace, list(request.block_hashes),
                                    request.lease_seconds, context)

    async def _acquired(self, namespace: str, hashes: list[bytes], lease_seconds: float,
                        context: Any) -> pb.AcquireResponse:
        lease, found = await self._plane().acquire(namespace, hashes, lease_seconds,
                                                   owner=_owner(context))
        return await self._held_to_pb(lease, found, pb.AcquireResponse())

    async def _held_to_pb(self, lease: Lease,
                          found: list[tuple[Slot | None, BlockMeta] | None],
                          resp: pb.AcquireResponse) -> pb.AcquireResponse:
        """``resp`` filled with the lease and where each block lies (built between the
        loop's other calls: ~1.7 us a block)."""
        resp.lease_id = lease.lease_id
        resp.lease_seconds = lease.deadline - self.engine.clock()
        slots, headers = resp.slots, resp.headers
        pace = Pace()
        for item in found:
            if pace.due():
                await pace.pause()
            if item is None:
                slots.add()
                headers.add()
                continue
            slot, meta = item
            if slot:
                add_slot(slots, slot, meta.key.block_hash, meta.checksum)
            else:
                slots.add()
            add_header(headers, meta)
        return resp

    @_unary
    async def Release(self, request: pb.ReleaseRequest, context: Any) -> pb.ReleaseResponse:
        corrupt = await self._plane().release(request.lease_id, _owner(context),
                                              list(request.corrupt_hashes))
        return pb.ReleaseResponse(corrupt=corrupt)

    @_unary
    async def Delete(self, request: pb.DeleteRequest, context: Any) -> pb.DeleteResponse:
        n = await self.engine.delete(request.namespace, list(request.block_hashes))
        return pb.DeleteResponse(deleted=n)

    @_unary
    async def Hint(self, request: pb.HintRequest, context: Any) -> pb.HintResponse:
        hint = Hint(
            session_id=request.session_id, event=request.event, workload=request.workload,
            tool=request.tool or None,
            expected_gap_s=(request.expected_gap_ms / 1000.0) if request.expected_gap_ms else None,
        )
        return pb.HintResponse(moves=self.engine.hint(hint, request.namespace,
                                                      _rid(request.request_id),
                                                      output_tokens=request.output_tokens))

    @_unary
    async def Retain(self, request: pb.RetainRequest, context: Any) -> pb.RetainResponse:
        n = self.engine.retain(request.namespace, list(request.block_hashes), request.ttl_s)
        return pb.RetainResponse(protected=n)

    @_unary
    async def Stats(self, request: pb.StatsRequest, context: Any) -> pb.StatsResponse:
        return stats_response(self.engine, current_tenant.get(), self.events, self.loop_lag,
                              request.loop_lag_window_s)

    @_unary
    async def Profile(self, request: pb.ProfileRequest, context: Any) -> pb.ProfileResponse:
        from kvstore.profile.wire import to_pb

        ret = self.engine.retention
        return to_pb(dataclasses.replace(self.profile.snapshot(), retained_blocks=ret.blocks,
                                         retained_came_back=ret.came_back))

    async def SubscribeEvents(self, request: pb.SubscribeRequest, context: Any
                              ) -> AsyncIterator[pb.EventBatch]:
        if self.events is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this server publishes no events")
            return
        from kvstore.server.events_service import subscribe_events

        async for batch in subscribe_events(self.events, request, context):
            yield batch
