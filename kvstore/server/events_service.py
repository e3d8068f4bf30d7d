"""``SubscribeEvents``: the event bus as a gRPC server stream.

The servicer delegates to :func:`subscribe_events`; each message carries the
batch exactly as published on ZMQ (same ``seq``, ``ts`` and msgpack payload).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.events.bus import EventBus

__all__ = ["subscribe_events"]


async def subscribe_events(
    bus: EventBus, request: pb.SubscribeRequest, context: Any
) -> AsyncIterator[pb.EventBatch]:
    """Buffered batches from ``request.start_seq`` (``-1``: live only), then live ones.

    Ends when the bus closes or the client cancels (gRPC cancels this generator).
    """
    stream = bus.subscribe(int(request.start_seq))
    try:
        async for batch in stream:
            yield pb.EventBatch(seq=batch.seq, ts=batch.ts, payload=batch.payload)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
