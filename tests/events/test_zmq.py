"""ZMQ publisher <-> router subscriber over loopback: order, gaps, late join, bad frames."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import msgspec
import pytest
import zmq
import zmq.asyncio
from kvstore.connectors.router import PodSubscriber, PrefixIndex

from kvstore.events import EventBus, EventsConfig, PublishedBatch, build_bus, wire
from kvstore.events.ingest import VllmEventIngest
from kvstore.events.zmq_publisher import END_SEQ, ZmqPublisher
from kvstore.hashing import block_hash_to_int
from kvstore.types import Medium

from .conftest import LOOPBACK_ANY, chain

TOPIC = "kv@pod-a@tiny"


def _cfg(**kw: object) -> EventsConfig:
    fields: dict[str, object] = {
        "endpoint": LOOPBACK_ANY,
        "replay_endpoint": LOOPBACK_ANY,
        "topic": TOPIC,
    }
    fields.update(kw)
    return EventsConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def bus() -> AsyncIterator[EventBus]:
    b = build_bus(_cfg())
    await b.start()
    yield b
    await b.close()


def _zmq_pub(bus: EventBus) -> ZmqPublisher:
    pub = bus._publishers[0]
    assert isinstance(pub, ZmqPublisher)
    return pub


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


async def _subscriber(bus: EventBus, index: PrefixIndex, start_seq: int | None) -> PodSubscriber:
    pub = _zmq_pub(bus)
    sub = PodSubscriber(
        "pod-a", pub.endpoint, index, replay_endpoint=pub.replay_endpoint, topic=TOPIC,
        start_seq=start_seq,
    )  # fmt: skip
    await sub.start()
    await asyncio.wait_for(sub.wait_synced(), 5)
    await asyncio.sleep(0.3)  # let the SUB subscription reach the PUB socket
    return sub


def _ints(metas: list) -> set[int]:  # type: ignore[type-arg]
    return {block_hash_to_int(m.key.block_hash) for m in metas}


async def test_index_follows_the_stream(bus: EventBus) -> None:
    index = PrefixIndex()
    sub = await _subscriber(bus, index, start_seq=0)
    try:
        metas = chain(list(range(128)))
        bus.block_stored(metas, Medium.GPU)
        bus.flush()
        bus.block_stored(metas[:2], Medium.CPU)
        bus.block_removed([m.key for m in metas[2:]], Medium.GPU)
        bus.flush()
        await _until(lambda: sub.stats.delivered == 2)
        assert index.blocks("pod-a", "gpu") == _ints(metas[:2])
        assert index.blocks("pod-a", "cpu") == _ints(metas[:2])
        bus.all_cleared()
        bus.flush()
        await _until(lambda: sub.stats.delivered == 3)
        assert index.blocks("pod-a") == set() and len(index) == 0
        assert sub.stats.gaps == 0 and sub.stats.malformed == 0
    finally:
        await sub.close()


async def test_gap_is_repaired_from_the_replay_socket(bus: EventBus) -> None:
    pub = _zmq_pub(bus)
    real_publish = pub.publish

    def lossy(batch: PublishedBatch) -> None:  # the network loses seq 1 and 2
        if batch.seq not in (1, 2):
            real_publish(batch)

    pub.publish = lossy  # type: ignore[method-assign]
    index = PrefixIndex()
    seen: list[int] = []
    sub = await _subscriber(bus, index, start_seq=0)
    sub._on_applied = lambda pod, seq, batch: seen.append(seq)
    try:
        metas = chain(list(range(32 * 4)))
        for m in metas:
            bus.block_stored([m], Medium.GPU)
            bus.flush()
        await _until(lambda: sub.stats.delivered == 4)
        assert seen == [0, 1, 2, 3]
        assert sub.stats.gaps == 1 and sub.stats.replayed >= 2 and sub.stats.missed == 0
        assert index.blocks("pod-a", "gpu") == _ints(metas)
    finally:
        await sub.close()


async def test_late_joiner_catches_up_then_follows_live(bus: EventBus) -> None:
    metas = chain(list(range(32 * 6)))
    for m in metas[:5]:
        bus.block_stored([m], Medium.CPU)
        bus.flush()
    index = PrefixIndex()
    sub = await _subscriber(bus, index, start_seq=0)
    try:
        assert sub.stats.replayed == 5
        assert index.blocks("pod-a", "cpu") == _ints(metas[:5])
        bus.block_stored(metas[5:], Medium.CPU)
        bus.flush()
        await _until(lambda: sub.stats.delivered == 6)
        assert index.blocks("pod-a", "cpu") == _ints(metas)
        assert sub.stats.duplicates == 0 and sub.stats.gaps == 0
    finally:
        await sub.close()


async def test_malformed_and_truncated_frames_are_counted_and_skipped() -> None:
    ctx = zmq.asyncio.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(LOOPBACK_ANY)
    endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    index = PrefixIndex()
    sub = PodSubscriber("p", endpoint, index)
    await sub.start()
    await asyncio.sleep(0.3)
    good = chain(list(range(96)))
    payload0 = wire.encode_batch(1.0, [wire.stored([1], None, [0] * 32, 32, "GPU")])
    payload2 = wire.encode_batch(2.0, [wire.stored([2], 1, [0] * 32, 32, "GPU")])
    try:
        topic = TOPIC.encode()
        await pub.send_multipart([topic, (0).to_bytes(8, "big"), payload0])
        await pub.send_multipart([topic, b"\x00\x01"])  # two parts
        await pub.send_multipart([topic, b"\x01\x02\x03", payload0])  # short seq
        await pub.send_multipart([topic, (1).to_bytes(8, "big"), payload0[:7]])  # truncated
        await pub.send_multipart([topic, (2).to_bytes(8, "big"), payload2])
        await _until(lambda: sub.stats.received == 5)
        assert sub.stats.malformed == 3 and sub.stats.delivered == 2
        assert index.blocks("p", "gpu") == {1, 2}
        assert sub.stats.gaps == 0
    finally:
        await sub.close()
        pub.close(0)
    assert good  # chain() helper works alongside


async def test_replay_socket_speaks_vllms_protocol(bus: EventBus) -> None:
    for _ in range(3):
        bus.all_cleared()
        bus.flush()
    ctx = zmq.asyncio.Context.instance()
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(_zmq_pub(bus).replay_endpoint)
    try:
        await req.send_multipart([b"", (1).to_bytes(8, "big")])
        frames = [await asyncio.wait_for(req.recv_multipart(), 5) for _ in range(3)]
    finally:
        req.close(0)
    assert [f[2] for f in frames[:2]] == [(1).to_bytes(8, "big"), (2).to_bytes(8, "big")]
    assert frames[0][:2] == [b"", TOPIC.encode()]
    assert frames[0][3] == bus.replay.since(1)[0].payload
    assert frames[2] == [b"", b"", END_SEQ, b""]


async def test_ingest_receives_a_connecting_publisher() -> None:
    got: list[wire.KVCacheEvent] = []
    ingest = VllmEventIngest(LOOPBACK_ANY, got.extend)
    await ingest.start()
    bus = build_bus(_cfg(endpoint=ingest.endpoint, endpoint_mode="connect", replay_endpoint="",
                         encoding="array"))
    await bus.start()
    try:
        await asyncio.sleep(0.5)  # the connecting PUB learns the subscription
        metas = chain(list(range(64)))
        bus.block_stored(metas, Medium.GPU)
        bus.flush()
        await _until(lambda: ingest.batches == 1)
        (event,) = got
        assert isinstance(event, wire.BlockStored)
        assert event.block_hashes == [block_hash_to_int(m.key.block_hash) for m in metas]
        # re-publishing foreign events converts them to the bus's encoding
        mem_bus = EventBus(EventsConfig(encoding="map", hash_format="bytes"))
        mem_bus.publish_events(got)
        out = wire.decode_batch(mem_bus.flush().payload)  # type: ignore[union-attr]
        assert type(out.events[0]) is wire.BlockStored
        assert out.events[0].block_hashes[0] == metas[0].key.block_hash[-8:]
        assert msgspec.msgpack.decode(mem_bus.replay.since(0)[0].payload)[1][0]["type"] == (
            "BlockStored"
        )
    finally:
        await bus.close()
        await ingest.close()


async def test_publisher_restart_resets_the_pod_and_resyncs() -> None:
    ctx = zmq.asyncio.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(LOOPBACK_ANY)
    index = PrefixIndex()
    sub = PodSubscriber("p", pub.getsockopt_string(zmq.LAST_ENDPOINT), index)
    await sub.start()
    await asyncio.sleep(0.3)
    topic = TOPIC.encode()

    async def send(seq: int, h: int) -> None:
        payload = wire.encode_batch(1.0, [wire.stored([h], None, [0] * 32, 32, "GPU")])
        await pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

    try:
        for seq in range(3):
            await send(seq, 100 + seq)
        await _until(lambda: sub.stats.delivered == 3)
        await send(0, 7)  # a new publisher process: sequence starts over
        await _until(lambda: sub.stats.delivered == 4)
        assert sub.stats.restarts == 1 and sub.stats.duplicates == 0
        assert index.blocks("p", "gpu") == {7}
    finally:
        await sub.close()
        pub.close(0)
