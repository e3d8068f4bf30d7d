"""Property-based fuzzing of the KV event decoder (``wire.decode_batch``): any
bytes, random msgpack values and mutated real batches either decode to our typed
events or raise :class:`~kvstore.events.wire.MalformedBatch` with a message, never
anything else; what decodes goes through the ingest mirror and a router's prefix
index without an error (the sidecar's ingest path and a router's)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvstore.connectors.router import PrefixIndex

from kvstore.events import VllmCacheMirror, wire
from tests.fuzzing import FUZZ

hashes = st.one_of(st.integers(0, 2**64 - 1), st.binary(min_size=1, max_size=32))
media = st.one_of(st.none(), st.sampled_from(["GPU", "CPU", "DISK", "REMOTE", "cpu", ""]))
encodings = st.sampled_from(wire.ENCODINGS)


@st.composite
def events(draw) -> wire.KVCacheEvent:
    enc = draw(encodings)
    kind = draw(st.sampled_from(["stored", "removed", "cleared"]))
    if kind == "stored":
        return wire.stored(draw(st.lists(hashes, max_size=5)), draw(st.one_of(st.none(), hashes)),
                           draw(st.lists(st.integers(-2**63, 2**63 - 1), max_size=20)),
                           draw(st.integers(0, 2**31)), draw(media), encoding=enc)
    if kind == "removed":
        return wire.removed(draw(st.lists(hashes, max_size=5)), draw(media), encoding=enc)
    return wire.cleared(encoding=enc)


batches = st.builds(lambda ts, evs, rank: wire.encode_batch(ts, evs, rank),
                    st.floats(allow_nan=False), st.lists(events(), max_size=6),
                    st.one_of(st.none(), st.integers(0, 8)))

msgpack_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
              st.text(max_size=10), st.binary(max_size=10)),
    lambda children: st.one_of(st.lists(children, max_size=5),
                               st.dictionaries(st.text(max_size=8), children, max_size=5)),
    max_leaves=30)


def check(payload: bytes) -> None:
    """Decodes to typed events (which the ingest mirror and a router take), or
    raises MalformedBatch; nothing else."""
    try:
        batch = wire.decode_batch(payload)
    except wire.MalformedBatch as exc:
        assert str(exc)
        return
    assert all(isinstance(e, wire.BlockStored | wire.BlockRemoved | wire.AllBlocksCleared)
               for e in batch.events)
    VllmCacheMirror().apply(batch.events)
    PrefixIndex().apply("pod", batch.events)


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes(payload):
    check(payload)


@FUZZ
@given(msgpack_values)
def test_arbitrary_msgpack_values(value):
    check(msgspec.msgpack.encode(value))


@FUZZ
@given(st.tuples(st.floats(), st.lists(msgpack_values, max_size=4), msgpack_values))
def test_batches_of_arbitrary_events(parts):
    check(msgspec.msgpack.encode(list(parts)))


@FUZZ
@given(batches, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255),
                                   st.sampled_from(["flip", "cut", "insert", "delete"])),
                         min_size=1, max_size=4))
def test_mutated_real_batches(payload, mutations):
    data = bytearray(payload)
    for pos, byte, how in mutations:
        i = pos % (len(data) + 1)
        if how == "flip" and i < len(data):
            data[i] ^= byte or 1
        elif how == "cut":
            del data[i:]
        elif how == "insert":
            data.insert(i, byte)
        elif how == "delete" and i < len(data):
            del data[i]
    check(bytes(data))


@FUZZ
@given(batches)
def test_real_batches_round_trip(payload):
    check(payload)
    assert wire.encode_batch(*_fields(wire.decode_batch(payload))) == payload


def _fields(batch: wire.KVEventBatch) -> tuple[float, list[wire.KVCacheEvent], int | None]:
    return batch.ts, list(batch.events), batch.data_parallel_rank


@pytest.mark.parametrize("depth", [1_000, 200_000])
def test_deeply_nested_input_is_malformed_not_a_crash(depth):
    """Regression (found by the fuzzing): msgspec raised RecursionError on deep
    nesting, which escaped decode_batch (and stopped ``kvstore events``)."""
    payload = b"\x93\xcb" + b"\x00" * 8 + b"\x91" * depth + b"\xc0" + b"\x00"
    with pytest.raises(wire.MalformedBatch, match="undecodable"):
        wire.decode_batch(payload)
