"""``SubscribeEvents`` over an in-process gRPC server on loopback, and ``kvstore events``."""

from __future__ import annotations

import argparse
import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from kvstore.events import EventBus, EventsConfig
from kvstore.server.events_service import subscribe_events
from kvstore.tools import events_tail as cli
from kvstore.types import Medium

from .conftest import chain


class _Servicer(pb_grpc.KVStoreServicer):
    def __init__(self, bus: EventBus) -> None:
        self.bus = bus

    # grpc.aio needs the method itself to be an async generator function.
    async def SubscribeEvents(  # noqa: N802
        self, request: pb.SubscribeRequest, context: Any
    ) -> AsyncIterator[pb.EventBatch]:
        async for message in subscribe_events(self.bus, request, context):
            yield message


@pytest.fixture
async def served() -> AsyncIterator[tuple[EventBus, str]]:
    bus = EventBus(EventsConfig())
    await bus.start()
    server = grpc.aio.server()
    pb_grpc.add_KVStoreServicer_to_server(_Servicer(bus), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield bus, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)
        await bus.close()


async def test_stream_replays_from_start_seq_then_live(served: tuple[EventBus, str]) -> None:
    bus, address = served
    metas = chain(list(range(96)))
    bus.block_stored(metas[:1], Medium.GPU)
    bus.flush()
    bus.block_stored(metas[1:2], Medium.GPU)
    bus.flush()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.KVStoreStub(channel)  # type: ignore[no-untyped-call]
        call = stub.SubscribeEvents(pb.SubscribeRequest(start_seq=1))
        got = [await call.read()]
        bus.block_removed([metas[0].key], Medium.GPU)
        got.append(await asyncio.wait_for(call.read(), 5))
        call.cancel()
    assert [m.seq for m in got] == [1, 2]
    assert got[0].payload == bus.replay.since(1)[0].payload


async def test_cli_tails_and_prints_one_event_per_line(served: tuple[EventBus, str]) -> None:
    bus, address = served
    metas = chain(list(range(64)))
    bus.block_stored(metas, Medium.CPU)
    bus.block_removed([metas[1].key], Medium.GPU)
    bus.flush()
    out = io.StringIO()
    assert await cli.tail(address, 0, 1, False, out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("0 ") and "BlockStored medium=CPU" in lines[0]
    assert "block_size=32 tokens=64" in lines[0]
    assert "BlockRemoved medium=GPU" in lines[1]


def test_cli_registers_the_events_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="kvstore")
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    args = parser.parse_args(["events", "--address", "h:1", "--start-seq", "5", "--json"])
    assert args.func is cli.func and args.start_seq == 5 and args.json
