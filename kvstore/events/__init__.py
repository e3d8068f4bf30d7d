"""Block events: vLLM-compatible wire structs, the bus, ZMQ publisher, ingest.

Pipeline: engine -> :class:`EventSink` (:class:`EventBus`) -> one encoded batch
per drain, numbered and kept for replay -> publishers (:class:`ZmqPublisher`)
and in-process subscribers (gRPC ``SubscribeEvents``). The worker's own vLLM
events come in through :class:`VllmEventIngest`. zmq is imported only by the
modules that need it (``zmq_publisher``, ``zmq_subscriber``, ``ingest``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvstore.events.bus import EventBus, MemoryPublisher, PublishedBatch, Publisher, ReplayBuffer
from kvstore.events.config import EventsConfig, is_bind_endpoint
from kvstore.events.mirror import VllmCacheMirror
from kvstore.events.sink import EventSink, NullSink, RecordingSink
from kvstore.events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
    MalformedBatch,
    decode_batch,
    encode_batch,
)

if TYPE_CHECKING:
    from kvstore.events.ingest import EventsCallback, VllmEventIngest

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBus",
    "EventSink",
    "EventsConfig",
    "KVCacheEvent",
    "KVEventBatch",
    "MalformedBatch",
    "MemoryPublisher",
    "NullSink",
    "PublishedBatch",
    "Publisher",
    "RecordingSink",
    "ReplayBuffer",
    "VllmCacheMirror",
    "build_bus",
    "build_ingest",
    "decode_batch",
    "encode_batch",
    "is_bind_endpoint",
]


def build_bus(config: EventsConfig) -> EventBus:
    """The bus with the ZMQ publisher the config asks for (none when disabled)."""
    bus = EventBus(config)
    if config.enabled:
        from kvstore.events.zmq_publisher import ZmqPublisher

        bus.add_publisher(ZmqPublisher(config, bus.replay))
    return bus


def build_ingest(config: EventsConfig, callback: EventsCallback) -> VllmEventIngest | None:
    """The SUB socket for the worker's own vLLM events, or ``None`` when not configured."""
    if not (config.enabled and config.ingest_endpoint):
        return None
    from kvstore.events.ingest import VllmEventIngest

    return VllmEventIngest(
        config.ingest_endpoint,
        callback,
        replay_endpoint=config.ingest_replay_endpoint or None,
    )
