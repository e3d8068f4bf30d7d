"""Helpers for the server tests with a redis tier: configs, waiting, reading event streams."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from kvstore.client import KVStoreClient
from kvstore.events import wire
from kvstore.events.media import tier_medium


def redis_section(url: str, prefix: str, **extra: Any) -> dict[str, Any]:
    return {"enabled": True, "url": url, "key_prefix": prefix, "capacity": "256MiB",
            "timeout": 0.5, "probe_timeout": 0.5, "retry_interval": 0.2, **extra}


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def tier_blocks(address: str, tier: str) -> int:
    with KVStoreClient(address, shared_memory=False) as c:
        st = c.stats()
    return next((t.blocks for t in st.tiers if t.name == tier), 0)


def event_payloads(address: str, until: Callable[[list[wire.KVCacheEvent]], bool],
                   timeout: float = 20.0) -> list[bytes]:
    """Batches (raw msgpack, as published on ZMQ) from seq 0 until ``until(events)``."""
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.KVStoreStub(channel)
    call = stub.SubscribeEvents(pb.SubscribeRequest(start_seq=0), timeout=timeout)
    payloads: list[bytes] = []
    events: list[wire.KVCacheEvent] = []
    try:
        for msg in call:
            payloads.append(msg.payload)
            events.extend(wire.decode_batch(msg.payload).events)
            if until(events):
                return payloads
    except grpc.RpcError as exc:
        raise AssertionError(f"event stream of {address} ended before the expected events "
                             f"({exc.code()}); got {events}") from exc
    finally:
        call.cancel()
        channel.close()
    raise AssertionError(f"event stream of {address} ended; got {events}")


def stored(events: list[wire.KVCacheEvent], medium: str) -> set[Any]:
    """Hashes announced as stored on ``medium`` (as the events carry them): ``REMOTE``
    is also vLLM 0.33's ``STORAGE`` + ``REMOTE`` (the default vocabulary)."""
    want = tier_medium(medium)
    out: set[Any] = set()
    for ev in events:
        if isinstance(ev, wire.BlockStored) and tier_medium(ev.medium, ev.locality) == want:
            out.update(ev.block_hashes)
    return out
