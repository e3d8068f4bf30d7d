"""Golden tests against vLLM's own msgspec classes (run in the vLLM venv by subprocess).

* batches our bus publishes decode with ``vllm.distributed.kv_events.KVEventBatch``
  (map encoding) and with vLLM's structs declared positional (array encoding, vLLM <= 0.23);
* batches vLLM encodes (both encodings, int and bytes hashes) decode with ours to the
  same fields;
* vLLM's real ``ZmqEventPublisher`` publishing to our ingest socket;
* both media vocabularies (``events.media``) decode with vLLM's classes to the
  medium / locality / ownership / session_id we sent, and the vLLM 0.33 mirror
  (:mod:`.vllm033`) has vLLM's own fields, in order, plus the one 0.33 appends.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from kvstore.events import EventBus, EventsConfig, MemoryPublisher, wire
from kvstore.events.ingest import VllmEventIngest
from kvstore.hashing import block_hash_to_int
from kvstore.types import Medium

from . import vllm033
from .conftest import HERE, LOOPBACK_ANY, chain, run_golden, vllm_env
from .test_golden_033 import _ours

pytestmark = pytest.mark.vllm

CASES: list[tuple[wire.Encoding, wire.HashFormat]] = [
    (enc, fmt) for enc in wire.ENCODINGS for fmt in wire.HASH_FORMATS
]


def _our_batch(encoding: wire.Encoding, hash_format: wire.HashFormat) -> bytes:
    cfg = EventsConfig(encoding=encoding, hash_format=hash_format, pod="p", model="m")
    mem = MemoryPublisher()
    bus = EventBus(cfg, [mem], clock=lambda: 99.25)
    metas = chain(list(range(96)), 32)
    bus.block_stored(metas[:2], Medium.GPU)
    bus.block_stored(metas[2:], Medium.CPU)
    bus.block_removed([metas[0].key], Medium.GPU)
    bus.all_cleared()
    batch = bus.flush()
    assert batch is not None
    return batch.payload


def _hash_json(h: bytes, hash_format: str) -> Any:
    return block_hash_to_int(h) if hash_format == "int" else msgspec.to_builtins(h)


@pytest.fixture(scope="module")
def golden(vllm_py: str) -> dict[str, Any]:
    decode = [
        {"name": f"{e}-{f}", "encoding": e, "payload_hex": _our_batch(e, f).hex()} for e, f in CASES
    ]
    decode += [{"name": f"media-{m}", "encoding": "map", "payload_hex": _ours(m).hex()}
               for m in wire.MEDIA]
    return run_golden(vllm_py, {"decode": decode, "produce": True, "fields": True})


@pytest.mark.parametrize(("media", "want"), [
    ("storage", [["CPU", "LOCAL", "dram"], ["STORAGE", "LOCAL", "disk"],
                 ["STORAGE", "REMOTE", "redis"]]),
    ("tiers", [["CPU", None, None], ["DISK", None, None], ["REMOTE", None, None]]),
])
def test_both_vocabularies_decode_with_vllm_classes(
    golden: dict[str, Any], media: str, want: list[list[Any]]
) -> None:
    name = f"media-{media}"
    assert name not in golden["errors"], golden["errors"].get(name)
    events = golden["decoded"][name]["events"]
    stored = [e for e in events if e["type"] == "BlockStored"]
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    assert [[e["medium"], e["locality"], e["ownership"]] for e in stored] == want
    assert [[e["medium"], e["locality"], e["ownership"]] for e in removed] == want
    assert {e["session_id"] for e in stored} == {"sess-1"}


def test_the_033_mirror_is_vllms_own_classes_plus_what_033_appends(
    golden: dict[str, Any]
) -> None:
    theirs = golden["fields"]
    assert golden["media"] == ["GPU", "CPU", "STORAGE"]
    assert vllm033.FIELDS["BlockStored"] == theirs["BlockStored"] + ["lookahead_token_ids"]
    assert vllm033.FIELDS["BlockRemoved"] == theirs["BlockRemoved"]
    assert vllm033.FIELDS["AllBlocksCleared"] == theirs["AllBlocksCleared"] == []


@pytest.mark.parametrize(("encoding", "hash_format"), CASES)
def test_our_batches_decode_with_vllm_classes(
    golden: dict[str, Any], encoding: str, hash_format: str
) -> None:
    name = f"{encoding}-{hash_format}"
    assert name not in golden["errors"], golden["errors"].get(name)
    got = golden["decoded"][name]
    metas = chain(list(range(96)), 32)
    hashes = [_hash_json(m.key.block_hash, hash_format) for m in metas]
    assert got["ts"] == 99.25 and got["dp"] == 0
    types = [e["type"] for e in got["events"]]
    assert types == ["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]
    first, second, removed, _ = got["events"]
    assert first["block_hashes"] == hashes[:2] and first["parent_block_hash"] is None
    assert first["token_ids"] == list(range(64)) and first["block_size"] == 32
    assert first["medium"] == "GPU" and first["lora_name"] is None
    assert second["block_hashes"] == hashes[2:] and second["parent_block_hash"] == hashes[1]
    assert second["medium"] == "CPU" and second["token_ids"] == list(range(64, 96))
    assert removed["block_hashes"] == hashes[:1] and removed["medium"] == "GPU"


@pytest.mark.parametrize(("encoding", "hash_format"), CASES)
def test_vllm_batches_decode_with_ours(
    golden: dict[str, Any], encoding: str, hash_format: str
) -> None:
    produced = golden["produced"][f"{encoding}-{hash_format}"]
    batch = wire.decode_batch(bytes.fromhex(produced["payload_hex"]))
    assert batch.ts == 1234.5 and batch.data_parallel_rank == 0
    ours = [
        dict(msgspec.structs.asdict(wire.to_encoding(e, "map")), type=_tag(e)) for e in batch.events
    ]
    for ev in ours:  # the field 0.33 appends: absent from 0.32's events, None in ours
        assert ev.pop("lookahead_token_ids", None) is None
    assert json.loads(json.dumps(msgspec.to_builtins(ours))) == produced["events"]


def _tag(event: wire.KVCacheEvent) -> str:
    for cls in (wire.BlockStored, wire.BlockRemoved, wire.AllBlocksCleared):
        if isinstance(event, cls):
            return cls.__name__
    raise AssertionError(type(event))


async def test_vllm_zmq_publisher_into_our_ingest(vllm_py: str) -> None:
    received: list[wire.KVCacheEvent] = []
    ingest = VllmEventIngest(LOOPBACK_ANY, received.extend, topic="kv@pod@m")
    await ingest.start()
    try:
        cmd = {"publish": {"endpoint": ingest.endpoint, "topic": "kv@pod@m", "batches": 8}}
        proc = await asyncio.create_subprocess_exec(
            vllm_py,
            str(HERE / "vllm_golden.py"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=vllm_env(),
        )
        _, err = await asyncio.wait_for(proc.communicate(json.dumps(cmd).encode()), 120)
        assert proc.returncode == 0, err.decode()[-3000:]
        for _ in range(50):
            if ingest.batches >= 8:
                break
            await asyncio.sleep(0.05)
    finally:
        await ingest.close()
    assert ingest.batches == 8 and ingest.stats.malformed == 0
    assert [_tag(e) for e in received[:4]] == [
        "BlockStored",
        "BlockStored",
        "BlockRemoved",
        "AllBlocksCleared",
    ]
    first = received[0]
    assert isinstance(first, wire.BlockStored)
    assert first.block_hashes == [0xF000_0000_0000_0001, 0xF000_0000_0000_0002]
    assert first.group_idx == 0 and first.extra_keys == [None, None]
