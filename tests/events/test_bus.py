"""The event bus: sink conversion, batching, ordering, replay, subscribers, config."""

from __future__ import annotations

import asyncio
import threading

import msgspec
import pytest

from kvstore.errors import ConfigError
from kvstore.events import (
    EventBus,
    EventsConfig,
    EventSink,
    MemoryPublisher,
    NullSink,
    RecordingSink,
    wire,
)
from kvstore.events.config import DEFAULT_MODEL
from kvstore.hashing import block_hash_to_int
from kvstore.types import BlockKey, Medium

from .conftest import chain


def _decode(payload: bytes) -> list[wire.KVCacheEvent]:
    return list(wire.decode_batch(payload).events)


def test_sinks_implement_the_protocol() -> None:
    for sink in (EventBus(), NullSink(), RecordingSink()):
        assert isinstance(sink, EventSink)
    rec = RecordingSink()
    rec.all_cleared()
    assert rec.calls == [("cleared", (), None)]


def test_stored_runs_split_at_chain_breaks() -> None:
    mem = MemoryPublisher()
    bus = EventBus(EventsConfig(), [mem])
    a, b = chain(list(range(96))), chain(list(range(1000, 1064)))
    bus.block_stored(a + b, Medium.DISK)  # two chains in one call
    bus.flush()
    events = _decode(mem.batches[0].payload)
    assert len(events) == 2
    first, second = events
    assert isinstance(first, wire.BlockStored) and isinstance(second, wire.BlockStored)
    assert first.block_hashes == [block_hash_to_int(m.key.block_hash) for m in a]
    assert first.parent_block_hash is None and first.medium == "STORAGE"
    assert (first.locality, first.ownership) == ("LOCAL", "disk")
    assert first.token_ids == list(range(96)) and first.block_size == 32
    assert second.block_hashes == [block_hash_to_int(m.key.block_hash) for m in b]


def test_parent_hash_of_a_continuation_and_bytes_format() -> None:
    mem = MemoryPublisher()
    bus = EventBus(EventsConfig(hash_format="bytes"), [mem])
    metas = chain(list(range(128)))
    bus.block_stored(metas[:1], Medium.GPU)
    bus.flush()
    bus.block_stored(metas[1:], Medium.GPU)
    bus.flush()
    second = _decode(mem.batches[1].payload)[0]
    assert isinstance(second, wire.BlockStored)
    assert second.parent_block_hash == metas[0].key.block_hash
    assert second.block_hashes == [m.key.block_hash for m in metas[1:]]


def test_flush_numbers_batches_and_buffers_them() -> None:
    mem = MemoryPublisher()
    bus = EventBus(EventsConfig(buffer_steps=3), [mem])
    key = BlockKey("m", b"\x01" * 32)
    for _ in range(5):
        bus.block_removed([key], Medium.CPU)
        bus.flush()
    assert [b.seq for b in mem.batches] == [0, 1, 2, 3, 4]
    assert bus.flush() is None  # nothing pending
    assert [b.seq for b in bus.replay.since(0)] == [2, 3, 4]
    assert [b.seq for b in bus.replay.since(4)] == [4]
    assert bus.replay.since(5) == []
    assert bus.events_published == 5 and bus.blocks_published == 5


async def test_events_of_one_step_travel_in_one_batch_in_order() -> None:
    mem = MemoryPublisher()
    bus = EventBus(EventsConfig(), [mem])
    await bus.start()
    metas = chain(list(range(96)))
    bus.block_stored(metas, Medium.GPU)
    bus.block_stored(metas[:1], Medium.CPU)
    bus.block_removed([metas[0].key], Medium.GPU)
    bus.all_cleared()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(mem.batches) == 1
    kinds = [type(e).__name__ for e in _decode(mem.batches[0].payload)]
    assert kinds == ["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]
    await bus.close()


async def test_the_bus_publishes_at_most_one_batch_per_batch_ms() -> None:
    # A commit of 512 blocks lets the loop go ~50 times, placing blocks before each:
    # a batch per drain cost the server as much as the commit's own work.
    metas = chain(list(range(3 * 32)))  # three blocks
    for batch_ms, batches_soon in ((200.0, 1), (0.0, 3)):
        mem = MemoryPublisher()
        bus = EventBus(EventsConfig(batch_ms=batch_ms), [mem])
        await bus.start()
        for i in range(3):  # three stores, each followed by the loop's turn
            bus.block_stored(metas[i:i + 1], Medium.CPU)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        assert len(mem.batches) == batches_soon, batch_ms
        if batch_ms:  # the rest follows within batch_ms, in one batch, in order
            await asyncio.sleep(batch_ms / 1e3 + 0.1)
            assert len(mem.batches) == 2
            stored = [e for e in _decode(mem.batches[1].payload)
                      if isinstance(e, wire.BlockStored)]
            assert [h for e in stored for h in e.block_hashes] == [
                block_hash_to_int(m.key.block_hash) for m in metas[1:3]]
        await bus.close()


async def test_calls_from_other_threads_keep_order() -> None:
    mem = MemoryPublisher()
    bus = EventBus(EventsConfig(), [mem])
    await bus.start()
    keys = [BlockKey("m", i.to_bytes(32, "big")) for i in range(2000)]

    def producer() -> None:
        for k in keys:
            bus.block_removed([k], Medium.GPU)

    thread = threading.Thread(target=producer)
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(0.001)
    thread.join()
    await bus.close()
    seen = [e.block_hashes[0] for b in mem.batches for e in _decode(b.payload)]  # type: ignore[attr-defined]
    assert seen == [block_hash_to_int(k.block_hash) for k in keys]
    assert [b.seq for b in mem.batches] == list(range(len(mem.batches)))


async def test_subscribe_replays_then_goes_live_without_duplicates() -> None:
    bus = EventBus(EventsConfig())
    await bus.start()
    key = BlockKey("m", b"\x02" * 32)
    for _ in range(3):
        bus.block_removed([key], Medium.GPU)
        bus.flush()
    got: list[int] = []

    async def consume(start: int, n: int) -> list[int]:
        out = []
        async for batch in bus.subscribe(start):
            out.append(batch.seq)
            if len(out) == n:
                break
        return out

    replaying = asyncio.create_task(consume(1, 4))
    live = asyncio.create_task(consume(-1, 2))
    await asyncio.sleep(0.01)
    bus.block_removed([key], Medium.GPU)
    await asyncio.sleep(0.01)
    bus.block_removed([key], Medium.GPU)
    got = await asyncio.wait_for(replaying, 5)
    assert got == [1, 2, 3, 4]
    assert await asyncio.wait_for(live, 5) == [3, 4]
    await bus.close()


async def test_subscription_ends_when_bus_closes() -> None:
    bus = EventBus(EventsConfig())
    await bus.start()

    async def consume() -> int:
        n = 0
        async for _ in bus.subscribe(-1):
            n += 1
        return n

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    bus.all_cleared()
    await asyncio.sleep(0.01)
    await bus.close()
    assert await asyncio.wait_for(task, 5) == 1


async def test_lagging_subscriber_resyncs_from_replay() -> None:
    bus = EventBus(EventsConfig(buffer_steps=4))
    await bus.start()
    stream = bus.subscribe(-1)
    first = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    for _ in range(10):  # queue limit 4: the subscriber falls behind
        bus.all_cleared()
        bus.flush()
    seqs = [(await first).seq]
    for _ in range(4):
        seqs.append((await stream.__anext__()).seq)
    await stream.aclose()  # type: ignore[attr-defined]
    assert seqs[0] == 0 and seqs[1:] == [6, 7, 8, 9]  # gap visible in seq
    await bus.close()


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("encoding", "json", "events.encoding must be one of map, array"),
        ("hash_format", "hex", "events.hash_format must be one of int, bytes"),
        ("endpoint", "http://x", "events.endpoint must be a ZMQ endpoint"),
        ("buffer_steps", 0, "events.buffer_steps must be a positive integer"),
        ("data_parallel_rank", -1, "events.data_parallel_rank"),
        ("batch_ms", -1.0, "events.batch_ms must be a number of milliseconds from 0 to 1000"),
        ("batch_ms", 5000.0, "events.batch_ms must be a number of milliseconds"),
        ("batch_ms", True, "events.batch_ms must be a number of milliseconds"),
        ("batch_ms", "2", "events.batch_ms must be a number of milliseconds"),
    ],
)
def test_config_errors_name_field_and_choices(field: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        EventsConfig(**{field: value})  # type: ignore[arg-type]


def test_config_defaults_and_topic() -> None:
    cfg = EventsConfig(pod="pod-1", model="Qwen/Qwen2.5-7B")
    # loopback only unless configured otherwise; the PUB socket binds its endpoint
    assert cfg.endpoint == "tcp://127.0.0.1:5557"
    assert cfg.replay_endpoint == "tcp://127.0.0.1:5558"
    assert cfg.binds and cfg.include_token_ids
    assert cfg.encoding == "map" and cfg.hash_format == "int"
    assert cfg.effective_topic == "kv@pod-1@Qwen/Qwen2.5-7B"
    assert EventsConfig(topic="t").effective_topic == "t"
    # the topic always names a model
    assert EventsConfig(pod="p").effective_topic == f"kv@p@{DEFAULT_MODEL}"
    assert EventsConfig(topic="t", model="").effective_topic == "t"
    assert not EventsConfig(endpoint="tcp://127.0.0.1:9", endpoint_mode="connect").binds
    assert not EventsConfig(endpoint="tcp://10.0.0.1:9", endpoint_mode="auto").binds
    assert EventsConfig(endpoint="tcp://*:9", endpoint_mode="auto").binds


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"model": ""}, "events.model: the topic"),
        ({"model": "a@b"}, "events.model must not contain '@'"),
        ({"pod": "p@q"}, "events.pod must not contain '@'"),
        ({"endpoint_mode": "listen"}, "events.endpoint_mode must be one of bind, connect, auto"),
    ],
)
def test_config_model_and_mode_errors(fields: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        EventsConfig(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_token_ids_left_out_keep_the_wire_shape(encoding: str) -> None:
    metas = chain(list(range(64)))
    bus = EventBus(EventsConfig(include_token_ids=False, encoding=encoding))  # type: ignore[arg-type]
    bus.block_stored(metas, Medium.CPU)
    foreign = wire.stored([7], None, [1, 2, 3], 3, "GPU")
    bus.publish_events([foreign])
    batch = bus.flush()
    assert batch is not None
    events = wire.decode_batch(batch.payload).events
    assert len(events) == 2
    ours, theirs = events
    assert isinstance(ours, wire.BlockStored) and isinstance(theirs, wire.BlockStored)
    assert ours.token_ids == [] and theirs.token_ids == []
    assert ours.block_size == len(metas[0].token_ids) and theirs.block_size == 3
    assert len(ours.block_hashes) == len(metas)
    # vLLM's shape with an empty token list: the field is there, not left out
    raw = msgspec.msgpack.decode(batch.payload)[1][0]
    if encoding == "array":
        assert raw[0] == "BlockStored" and raw[3] == [] and raw[4] == ours.block_size
    else:
        assert raw["token_ids"] == []


def test_config_from_toml_table() -> None:
    cfg = EventsConfig.from_mapping({"endpoint": "tcp://*:6000", "encoding": "array"})
    assert cfg.endpoint == "tcp://*:6000" and cfg.encoding == "array"
    with pytest.raises(ConfigError, match=r"events.endpont: unknown setting; valid: .*endpoint"):
        EventsConfig.from_mapping({"endpont": "tcp://*:1"})
    with pytest.raises(ConfigError, match="events.buffer_steps must be int, got str"):
        EventsConfig.from_mapping({"buffer_steps": "10"})
    # a float setting takes TOML's integers (5 for 5.0), not its booleans
    assert EventsConfig.from_mapping({"batch_ms": 5}).batch_ms == 5.0
    with pytest.raises(ConfigError, match="events.batch_ms must be float, got bool"):
        EventsConfig.from_mapping({"batch_ms": True})
