"""Wire structs: both encodings, both hash forms, hand-packed bytes, malformed input."""

from __future__ import annotations

import msgspec
import pytest

from kvstore.events import wire
from kvstore.hashing import block_hash_to_int


def _stored(encoding: wire.Encoding) -> wire.KVCacheEvent:
    return wire.stored([1, 2], None, list(range(64)), 32, "GPU", encoding=encoding)


@pytest.mark.parametrize("encoding", wire.ENCODINGS)
def test_roundtrip_both_encodings(encoding: wire.Encoding) -> None:
    events = [
        _stored(encoding),
        wire.removed([1], "CPU", encoding=encoding),
        wire.cleared(encoding=encoding),
    ]
    batch = wire.decode_batch(wire.encode_batch(1.5, events, 0))
    assert batch.ts == 1.5 and batch.data_parallel_rank == 0
    assert [type(e).__mro__[1 if encoding == "array" else 0] for e in batch.events] == [
        wire.BlockStored,
        wire.BlockRemoved,
        wire.AllBlocksCleared,
    ]
    stored = batch.events[0]
    assert isinstance(stored, wire.BlockStored)
    assert stored.block_hashes == [1, 2] and stored.token_ids == list(range(64))


def test_hand_packed_map_bytes() -> None:
    # ["ts", [{"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}], 0]
    payload = msgspec.msgpack.encode(
        [2.0, [{"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}], 0]
    )
    assert wire.decode_batch(payload).events == [wire.BlockRemoved([5], "GPU")]
    assert wire.encode_batch(2.0, [wire.removed([5], "GPU")], 0) == payload


def test_hand_packed_array_bytes_old_vllm() -> None:
    # vLLM <= 0.23: positional, tag first, no trailing defaults (6 BlockStored fields then).
    payload = msgspec.msgpack.encode(
        [3.0, [["BlockStored", [9], None, [1, 2], 2, None, "GPU"], ["AllBlocksCleared"]], 0]
    )
    events = wire.decode_batch(payload).events
    assert isinstance(events[0], wire.BlockStored)
    assert events[0].block_hashes == [9] and events[0].lora_name is None
    assert isinstance(events[1], wire.AllBlocksCleared)


def test_array_encoding_is_positional_in_vllm_field_order() -> None:
    # msgspec writes every field of an array-like struct (as vLLM <= 0.23 did);
    # older decoders ignore the trailing ones they do not know.
    raw = msgspec.msgpack.decode(wire.encode_batch(0.0, [_stored("array")], None))
    fields = [f.name for f in msgspec.structs.fields(wire.BlockStored)]
    assert fields[:7] == [
        "block_hashes", "parent_block_hash", "token_ids", "block_size",
        "lora_id", "medium", "lora_name",
    ]  # fmt: skip
    event = raw[1][0]
    assert event[:8] == ["BlockStored", [1, 2], None, list(range(64)), 32, None, "GPU", None]
    assert len(event) == 1 + len(fields)


def test_to_encoding_converts_class_and_hashes() -> None:
    digest = bytes(range(32))
    ev = wire.stored([digest], None, [1] * 16, 16, "GPU", encoding="map")
    arr = wire.to_encoding(ev, "array", "int")
    assert isinstance(arr, wire.BlockStored) and type(arr) is not wire.BlockStored
    assert arr.block_hashes == [block_hash_to_int(digest)]
    back = wire.to_encoding(arr, "map", "bytes")
    assert type(back) is wire.BlockStored
    assert back.block_hashes == [block_hash_to_int(digest).to_bytes(8, "big")]


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", b"\x93\xcb", msgspec.msgpack.encode([1.0, [{"type": "Nope"}], 0])],
)
def test_malformed_payload_raises_ours(payload: bytes) -> None:
    with pytest.raises(wire.MalformedBatch):
        wire.decode_batch(payload)


def test_truncated_payload_raises_ours() -> None:
    payload = wire.encode_batch(1.0, [_stored("map")], 0)
    with pytest.raises(wire.MalformedBatch):
        wire.decode_batch(payload[: len(payload) // 2])
