"""Golden tests against vLLM 0.33's structs (mirrored in :mod:`.vllm033`): what the bus
publishes in each media vocabulary decodes with them to the fields a router on the
current vLLM reads, and what they encode (a 0.33 worker's events, lookahead tokens and
all) decodes with ours."""

from __future__ import annotations

import msgspec
import pytest

from kvstore.events import EventBus, EventsConfig, MemoryPublisher, wire
from kvstore.hashing import block_hash_to_int
from kvstore.types import BlockMeta, Medium

from . import vllm033
from .conftest import chain

_decoder = msgspec.msgpack.Decoder(vllm033.KVEventBatch)


def _ours(media: str) -> bytes:
    mem = MemoryPublisher()
    bus = EventBus(EventsConfig(media=media, pod="p", model="m"), [mem],  # type: ignore[arg-type]
                   clock=lambda: 7.5)
    metas = [BlockMeta(m.key, m.parent_hash, m.token_ids, m.size, 0, session_id="sess-1")
             for m in chain(list(range(128)), 32)]
    bus.block_stored(metas[:1], Medium.CPU)
    bus.block_stored(metas[1:2], Medium.DISK)
    bus.block_stored(metas[2:], Medium.REMOTE)
    bus.block_removed([metas[0].key], Medium.CPU)
    bus.block_removed([metas[1].key], Medium.DISK)
    bus.block_removed([metas[2].key], Medium.REMOTE)
    bus.flush()
    return mem.batches[0].payload


@pytest.mark.parametrize(("media", "want"), [
    ("storage", [("CPU", "LOCAL", "dram"), ("STORAGE", "LOCAL", "disk"),
                 ("STORAGE", "REMOTE", "redis")]),
    ("tiers", [("CPU", None, None), ("DISK", None, None), ("REMOTE", None, None)]),
])
def test_our_batches_decode_with_vllm_033_structs(media: str, want: list[tuple]) -> None:
    batch = _decoder.decode(_ours(media))
    assert batch.ts == 7.5 and batch.data_parallel_rank == 0
    stored = [e for e in batch.events if isinstance(e, vllm033.BlockStored)]
    removed = [e for e in batch.events if isinstance(e, vllm033.BlockRemoved)]
    assert [(e.medium, e.locality, e.ownership) for e in stored] == want
    assert [(e.medium, e.locality, e.ownership) for e in removed] == want
    assert {e.session_id for e in stored} == {"sess-1"}
    assert all(e.lookahead_token_ids is None for e in stored)
    metas = chain(list(range(128)), 32)
    assert stored[2].block_hashes == [block_hash_to_int(m.key.block_hash) for m in metas[2:]]
    assert stored[2].parent_block_hash == block_hash_to_int(metas[1].key.block_hash)


def test_vllm_033_events_decode_with_ours() -> None:
    enc = msgspec.msgpack.Encoder()
    events = [
        vllm033.BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=list(range(32)),
                            block_size=16, lora_id=None, medium="STORAGE", lora_name=None,
                            group_idx=0, kv_cache_spec_kind="full_attention", locality="REMOTE",
                            ownership="lmcache", session_id="s9", lookahead_token_ids=[3, 4]),
        vllm033.BlockRemoved(block_hashes=[2], medium="STORAGE", locality="LOCAL",
                             ownership="disk"),
        vllm033.AllBlocksCleared(),
    ]
    got = wire.decode_batch(enc.encode(vllm033.KVEventBatch(ts=1.0, events=events,
                                                            data_parallel_rank=3)))
    assert got.data_parallel_rank == 3
    ours = [msgspec.structs.asdict(e) for e in got.events]
    theirs = [msgspec.structs.asdict(e) for e in events]
    assert ours == theirs


def test_our_fields_are_vllm_033s_in_order() -> None:
    for ours, theirs in ((wire.BlockStored, vllm033.BlockStored),
                         (wire.BlockRemoved, vllm033.BlockRemoved)):
        assert [f.name for f in msgspec.structs.fields(ours)] == vllm033.FIELDS[theirs.__name__]
