"""Bad input: a specific status, a message naming the problem, and the server
keeps serving with nothing already stored lost or corrupted."""

from __future__ import annotations

import time

import grpc
import pytest

from kvstore import BlockData, KVStoreClient, errors
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from tests.blocks import make_chain

MiB = 2**20


@pytest.fixture
def srv(server_factory):
    # lru admits every block into DRAM, so a block larger than it meets the tier's check
    # (workload would place it on disk, where it fits).
    return server_factory(dram={"capacity": "16MiB"}, server={"max_block_bytes": 32 * MiB,
                                                              "lease_seconds": 0.5},
                          engine={"policy": "lru"})


@pytest.fixture
def stub(srv):
    channel = grpc.insecure_channel(srv.address, options=[
        ("grpc.max_send_message_length", 64 * MiB)])
    yield pb_grpc.KVStoreStub(channel)
    channel.close()


@pytest.fixture
def stored(srv):
    """Blocks stored before the bad input, checked intact after it."""
    blocks = make_chain(4, 64 * 1024, seed=99)
    with KVStoreClient(srv.address) as c:
        c.put("good", blocks)
    yield blocks
    with KVStoreClient(srv.address) as c:
        got = c.get("good", [b.block_hash for b in blocks])
        assert [g.payload if g else None for g in got] == [b.payload for b in blocks]
        fresh = make_chain(2, 4096, seed=100)
        assert c.put("good", fresh) == 2  # still serving


def _status(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def _put(stub, ns, block_hash, payload, parent=b""):
    req = pb.PutRequest(namespace=ns, blocks=[pb.Block(
        header=pb.BlockHeader(block_hash=block_hash, parent_hash=parent, token_ids=[1, 2]),
        payload=payload)])
    return stub.Put(iter([req]))


H = b"\x01" * 32


def test_empty_payload(stub, stored):
    code, msg = _status(lambda: _put(stub, "ns", H, b""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "payload is empty" in msg


def test_oversized_payload(stub, stored):
    code, msg = _status(lambda: _put(stub, "ns", H, b"x" * (33 * MiB)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_block_bytes" in msg


def test_wrong_hash_length(srv, stub, stored):
    code, msg = _status(lambda: _put(stub, "ns", b"\x01" * 20, b"x"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "got 20 bytes" in msg
    with KVStoreClient(srv.address) as c, pytest.raises(errors.InvalidBlock, match="20 bytes"):
        c.lookup("good", [b"\x02" * 20])
    # a namespace keeps one hash length
    code, msg = _status(lambda: _put(stub, "good", b"\x01" * 16, b"x"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "32-byte" in msg


def test_unknown_namespace_on_get(srv, stored):
    with KVStoreClient(srv.address, shared_memory=False) as c, \
            pytest.raises(errors.NamespaceNotFound, match="'nope'"):
        c.get("nope", [H])
    with KVStoreClient(srv.address, shared_memory=True) as c, \
            pytest.raises(errors.NamespaceNotFound, match="'nope'"):
        c.get("nope", [H])


def test_block_larger_than_a_tier(stub, stored):
    code, msg = _status(lambda: _put(stub, "ns", H, b"x" * (20 * MiB)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "never fit tier 'dram'" in msg


def test_descriptor_outside_its_segment(stub, stored):
    resv = stub.Reserve(pb.ReserveRequest(namespace="ns", sizes=[4096], block_hashes=[H]))
    d = resv.slots[0]
    bad = pb.SlotDescriptor(segment=d.segment, offset=1 << 40, length=4096, slot_id=d.slot_id,
                            block_hash=H)
    code, msg = _status(lambda: stub.Commit(pb.CommitRequest(
        namespace="ns", slots=[bad], headers=[pb.BlockHeader(block_hash=H)])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "outside" in msg
    wrong_seg = pb.SlotDescriptor(segment="not-ours", offset=0, length=4096, slot_id=d.slot_id)
    code, msg = _status(lambda: stub.Commit(pb.CommitRequest(
        namespace="ns", slots=[wrong_seg], headers=[pb.BlockHeader(block_hash=H)])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not-ours" in msg
    # the reservation survives bad commits; the real descriptor still commits
    assert stub.Commit(pb.CommitRequest(
        namespace="ns", slots=[d], headers=[pb.BlockHeader(block_hash=H)])).stored == 1


def test_commit_of_slot_never_reserved(stub, stored):
    ghost = pb.SlotDescriptor(segment="x", offset=0, length=10, slot_id=987654)
    code, msg = _status(lambda: stub.Commit(pb.CommitRequest(
        namespace="ns", slots=[ghost], headers=[pb.BlockHeader(block_hash=H)])))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "never reserved" in msg


def test_expired_lease(srv, stub, stored):
    lease = stub.Acquire(pb.AcquireRequest(namespace="good",
                                           block_hashes=[stored[0].block_hash]))
    assert lease.slots[0].length == len(stored[0].payload)
    time.sleep(1.2)  # lease_seconds = 0.5; the sweeper runs every 0.5 s
    code, msg = _status(lambda: stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "expired" in msg


def test_hint_validation(srv, stored):
    with KVStoreClient(srv.address) as c:
        with pytest.raises(errors.InvalidArgument, match="unknown event 'lunch'"):
            c.hint("s1", "lunch", namespace="good")
        with pytest.raises(errors.InvalidArgument, match="unknown workload"):
            c.hint("s1", "turn_end", workload="gaming", namespace="good")
        with pytest.raises(errors.InvalidArgument, match="scoped by namespace"):
            c.hint("s1", "turn_end", workload="chat")
        assert c.hint("s1", "turn_end", workload="chat", namespace="good") >= 0


def test_client_errors_carry_their_class(srv, stored):
    with KVStoreClient(srv.address) as c, pytest.raises(errors.PayloadTooLarge):
        c.put("ns", [BlockData(H, None, [1], b"x" * (33 * MiB))])


def test_unreachable_server_is_unavailable():
    from tests.conftest import free_port

    with KVStoreClient(f"127.0.0.1:{free_port()}", timeout=1.0) as c, \
            pytest.raises(errors.Unavailable, match="unreachable"):
        c.stats()
