"""Integrity through the real server: bounded requests, owned slots and leases,
verified shared-memory reads, exported failure counters, and what a restart tells
routers (issue: integrity under load)."""

from __future__ import annotations

import math

import grpc
import pytest
from kvstore.connectors.router import PrefixIndex

from kvstore import KVStoreClient
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from kvstore.events import wire
from tests.blocks import make_chain
from tests.server.rogue import corrupt_in_dram
from tests.server.test_ingest import _events

MiB = 2**20


def _stub(address: str) -> tuple[grpc.Channel, pb_grpc.KVStoreStub]:
    # Own connection per channel (gRPC shares one per target by default): two stubs
    # are two clients to the server.
    ch = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 * MiB),
                                                 ("grpc.use_local_subchannel_pool", 1)])
    return ch, pb_grpc.KVStoreStub(ch)


def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_a_get_cannot_ask_for_one_block_many_times(server_factory):
    srv = server_factory(server={"max_hashes_per_call": 1000})
    (block,) = make_chain(1, MiB, seed=1)
    with KVStoreClient(srv.address) as c:
        c.put("m", [block])
    ch, stub = _stub(srv.address)
    with ch:
        code, msg = _code(lambda: list(stub.Get(pb.GetRequest(
            namespace="m", block_hashes=[block.block_hash] * 1500))))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 1000" in msg
        code, msg = _code(lambda: list(stub.Get(pb.GetRequest(
            namespace="m", block_hashes=[block.block_hash] * 2))))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "duplicate" in msg
        code, msg = _code(lambda: stub.Lookup(pb.LookupRequest(
            namespace="m", block_hashes=[block.block_hash] * 1001)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("seconds", [math.inf, math.nan, 1e300])
def test_read_leases_of_any_length_are_refused(server, seconds):
    (block,) = make_chain(1, 4096, seed=2)
    with KVStoreClient(server.address) as c:
        c.put("m", [block])
    ch, stub = _stub(server.address)
    with ch:
        code, msg = _code(lambda: stub.Acquire(pb.AcquireRequest(
            namespace="m", block_hashes=[block.block_hash], lease_seconds=seconds)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "lease_seconds" in msg
    assert not server.engine.leases.pins


def test_a_slot_cannot_be_aborted_or_committed_by_another_client(server):
    (block,) = make_chain(1, 4096, seed=3)
    ch1, mine = _stub(server.address)
    ch2, theirs = _stub(server.address)
    with ch1, ch2:
        resv = mine.Reserve(pb.ReserveRequest(namespace="m", sizes=[4096],
                                              block_hashes=[block.block_hash]))
        slot = resv.slots[0]
        code, _ = _code(lambda: theirs.Abort(pb.AbortRequest(slot_ids=[slot.slot_id])))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        code, _ = _code(lambda: theirs.Abort(pb.AbortRequest(slot_ids=[slot.slot_id ^ 1])))
        assert code == grpc.StatusCode.FAILED_PRECONDITION  # a guessed id is unknown
        header = pb.BlockHeader(block_hash=block.block_hash, size=4096)
        code, _ = _code(lambda: theirs.Commit(pb.CommitRequest(
            namespace="m", slots=[slot], headers=[header])))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        mine.Abort(pb.AbortRequest(slot_ids=[slot.slot_id]))


def test_a_corrupt_slot_is_a_miss_reported_and_dropped(server):
    blocks = make_chain(3, 64 * 1024, seed=4)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(server.address, shared_memory=True) as c:
        c.put("m", blocks)
        server.drain()
        corrupt_in_dram(server, "m", hashes[1], at=100)
        got = c.get("m", hashes)
        assert got[0] is not None and got[0].payload == blocks[0].payload
        assert got[1] is None or got[1].payload == blocks[1].payload  # never wrong bytes
        assert got[2] is not None and got[2].payload == blocks[2].payload
        st = c.stats()
        assert st.corrupt_reads >= 1
        # The corrupt DRAM copy is gone; the disk copy (written back before) serves.
        assert c.lookup("m", hashes).num_hit == 3
        again = c.get("m", hashes)
        assert [g.payload if g else None for g in again] == [b.payload for b in blocks]


def test_failure_counters_are_exported(server):
    with KVStoreClient(server.address) as c:
        st = c.stats()
    for name in ("transfers_failed", "transfers_dropped", "events_dropped", "corrupt_reads",
                 "orphans_dropped", "demotions_failed", "startup_skipped", "quarantined_slots"):
        assert getattr(st, name) == 0, name
    from prometheus_client import generate_latest

    from kvstore.metrics import make_registry

    text = generate_latest(make_registry(server.engine, server.server.events)).decode()
    for metric in ("kvstore_transfers_failed_total", "kvstore_events_dropped_total",
                   "kvstore_corrupt_reads_total", "kvstore_startup_skipped"):
        assert metric in text


def test_a_restart_tells_routers_what_is_gone(server_factory, tmp_path):
    """The first batch after a start clears what the last run announced, then stores
    what survived on disk: a router that missed the sequence reset still ends right."""
    cfg = {"disk": {"path": str(tmp_path / "disk")}}
    first = server_factory(**cfg)
    durable = make_chain(3, 4096, seed=5)
    with KVStoreClient(first.address) as c:
        c.put("m", durable)
        first.drain()
    index = PrefixIndex()
    index.apply("pod", _events(first, want=7))  # cleared, 3 CPU, 3 DISK
    on_disk = index.blocks("pod", "disk")
    assert len(index.blocks("pod", "cpu")) == 3 and len(on_disk) == 3
    first.stop()
    second = server_factory(**cfg)
    events = _events(second, want=2)
    assert isinstance(events[0], wire.AllBlocksCleared)
    index.apply("pod", events)
    # The DRAM copies died with the last run: the router no longer counts them.
    assert index.blocks("pod", "cpu") == set()
    assert index.blocks("pod", "disk") == on_disk
