"""The public API the engine, the servicer and routers use (changes here are deliberate)."""

from __future__ import annotations

import kvstore.connectors.router as router

import kvstore.events as events


def test_events_api() -> None:
    assert set(events.__all__) == {
        "AllBlocksCleared", "BlockRemoved", "BlockStored", "EventBus", "EventSink",
        "EventsConfig", "KVCacheEvent", "KVEventBatch", "MalformedBatch", "MemoryPublisher",
        "NullSink", "PublishedBatch", "Publisher", "RecordingSink", "ReplayBuffer",
        "VllmCacheMirror", "build_bus", "build_ingest", "decode_batch", "encode_batch",
        "is_bind_endpoint",
    }  # fmt: skip


def test_router_api() -> None:
    assert set(router.__all__) == {
        "DEFAULT_WEIGHTS", "FleetSubscriber", "PodSubscriber", "PrefixIndex", "PrefixScorer",
        "request_block_hashes",
    }  # fmt: skip


def test_importing_events_does_not_import_zmq_or_grpc() -> None:
    import subprocess
    import sys

    code = "import sys, kvstore.events; print('zmq' in sys.modules, 'grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
