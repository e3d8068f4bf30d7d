"""``hold_in_place``: stored blocks handed out as views of the server's shared memory
that outlive the call, under one read lease that ends when the last view is let go
(the LMCache plugin's zero-copy gets)."""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from kvstore import KVStoreClient
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from tests.blocks import make_chain
from tests.server.rogue import corrupt_in_dram


def _leases_gone(srv: Any, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and len(srv.engine.leases):
        time.sleep(0.02)
    return len(srv.engine.leases) == 0 and not srv.engine.leases.pins


def test_views_are_the_stored_bytes_until_the_last_is_let_go(server: Any) -> None:
    blocks = make_chain(3, 50_000, seed=21)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(server.address, shared_memory=True) as c:
        c.put("h", blocks)
        held = c.hold_in_place("h", [*hashes, b"\x07" * 32])  # the last is not stored
        assert held is not None and held.held == 3
        assert [bytes(v) for v in held.views[:3]] == [b.payload for b in blocks]
        assert held.views[3] is None and held.sizes == [50_000] * 3 + [0]
        assert held.elsewhere == []
        # While held, the blocks are pinned: the lease is the server's, not the call's.
        assert len(server.engine.leases) == 1
        held.let_go(0)
        held.let_go(0)  # idempotent
        held.let_go(2)
        assert held.held == 1 and len(server.engine.leases) == 1
        assert bytes(held.views[1]) == blocks[1].payload
        held.let_go(1)
        assert _leases_gone(server)
        # Nothing was dropped or moved by holding it.
        assert [g.payload for g in c.get("h", hashes)] == [b.payload for b in blocks]


def test_a_corrupt_slot_is_not_handed_out_and_is_reported(server: Any) -> None:
    blocks = make_chain(2, 64 * 1024, seed=22)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(server.address, shared_memory=True) as c:
        c.put("h", blocks)
        server.drain()
        corrupt_in_dram(server, "h", hashes[1], at=7)
        held = c.hold_in_place("h", hashes)
        assert held is not None
        assert bytes(held.views[0]) == blocks[0].payload
        assert held.views[1] is None and held.sizes[1] == 0
        held.let_go_all()
        assert _leases_gone(server)
        assert c.stats().corrupt_reads >= 1
        # The corrupt DRAM copy is gone: the disk copy serves the right bytes.
        assert [g.payload for g in c.get("h", hashes)] == [b.payload for b in blocks]


def test_a_view_kept_past_its_lease_never_shows_another_blocks_bytes(
        server_factory: Any) -> None:
    """A holder keeps its views many leases long while other blocks push through a
    small DRAM tier: the lease is renewed while the views are held, so their slots
    are never given to a newcomer (before: the lease ended, the blocks were evicted,
    and the views showed the newcomers' bytes)."""
    srv = server_factory(server={"lease_seconds": 0.6}, dram={"capacity": "2MiB"})
    mine = make_chain(4, 64 * 1024, seed=24)
    # 40 chains of 10 blocks: 25 MiB through a 2 MiB tier
    others = [make_chain(10, 64 * 1024, seed=100 + i) for i in range(40)]
    with KVStoreClient(srv.address, shared_memory=True) as c:
        c.put("h", mine)
        held = c.hold_in_place("h", [b.block_hash for b in mine])
        assert held is not None and held.held == 4
        deadline = time.monotonic() + 2.5  # four leases long
        k = 0
        while time.monotonic() < deadline:
            c.put("h", others[k % len(others)])
            k += 1
            assert [bytes(v) for v in held.views] == [b.payload for b in mine]  # type: ignore[arg-type]
            time.sleep(0.05)
        assert held.renewals >= 3 and held.covered
        assert srv.engine.stats.evictions["dram"] > 0  # the tier was under pressure
        held.let_go_all()
        assert _leases_gone(srv)


def test_a_lease_that_cannot_be_renewed_is_warned_about(server_factory: Any,
                                                        caplog: Any) -> None:
    srv = server_factory(server={"lease_seconds": 0.4})
    blocks = make_chain(1, 10_000, seed=23)
    with KVStoreClient(srv.address, shared_memory=True) as c:
        c.put("h", blocks)
        with caplog.at_level(logging.WARNING, logger="kvstore.client"):
            held = c.hold_in_place("h", [blocks[0].block_hash])
            assert held is not None
            srv.stop()  # the sidecar goes away: nothing can renew the lease
            deadline = time.monotonic() + 3.0
            while held.covered and time.monotonic() < deadline:
                time.sleep(0.02)
        assert not held.covered
        assert "could not be renewed" in caplog.text
        held.let_go(0)

def test_over_grpc_there_is_nothing_to_hold(server: Any) -> None:
    blocks = make_chain(1, 1000, seed=24)
    with KVStoreClient(server.address, shared_memory=False) as c:
        c.put("h", blocks)
        assert c.hold_in_place("h", [blocks[0].block_hash]) is None


def test_views_outlive_a_stopped_server_and_a_closed_client(server_factory: Any) -> None:
    """The sidecar gone (its segments unlinked) or the client closed while a reader
    still holds views: the views stay readable (the mapping lives until they go) and
    letting go raises nothing."""
    srv = server_factory()
    blocks = make_chain(2, 100_000, seed=25)
    c = KVStoreClient(srv.address, shared_memory=True, timeout=2)
    c.put("h", blocks)
    held = c.hold_in_place("h", [b.block_hash for b in blocks])
    assert held is not None
    srv.stop()
    assert [bytes(v) for v in held.views] == [b.payload for b in blocks]  # no SIGBUS
    held.let_go(0)
    c.close()
    assert bytes(held.views[1]) == blocks[1].payload
    held.let_go(1)  # the Release goes nowhere, quietly


def test_lookup_and_hold_is_a_lookup_and_a_hold_in_one_round_trip(server: Any) -> None:
    """The policy sees a lookup like any other; the hit prefix comes back held, the
    blocks past it are not leased."""
    blocks = make_chain(4, 40_000, seed=26)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(server.address, shared_memory=True) as c:
        c.put("h", blocks[:3])  # the fourth is not stored: num_hit 3
        before = c.stats()
        found, held = c.lookup_and_hold("h", hashes, workload="chat")
        after = c.stats()
        assert found.num_hit == 3 and len(found.media) == 3
        assert after.lookups == before.lookups + 1
        assert after.lookup_hit_blocks == before.lookup_hit_blocks + 3
        assert held is not None and held.held == 3 and len(held.views) == 3
        assert [bytes(v) for v in held.views] == [b.payload for b in blocks[:3]]
        assert held.elsewhere == [] and held.sizes == [40_000] * 3
        lease = next(iter(server.engine.leases._leases.values()))
        assert {k.block_hash for k in lease.keys} == set(hashes[:3])
        held.let_go_all()
        assert _leases_gone(server)
        # A miss holds nothing and takes no lease.
        found, held = c.lookup_and_hold("h", [b"\x09" * 32])
        assert found.num_hit == 0 and held is None
        assert len(server.engine.leases) == 0


def test_lookup_and_hold_reports_a_corrupt_slot_and_over_grpc_holds_nothing(
        server: Any) -> None:
    blocks = make_chain(2, 64 * 1024, seed=27)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(server.address, shared_memory=True) as c:
        c.put("h", blocks)
        server.drain()
        corrupt_in_dram(server, "h", hashes[0], at=3)
        found, held = c.lookup_and_hold("h", hashes)
        assert found.num_hit == 2 and held is not None
        assert held.views[0] is None and held.sizes[0] == 0
        assert bytes(held.views[1]) == blocks[1].payload
        held.let_go(1)
        assert _leases_gone(server) and c.stats().corrupt_reads >= 1
        assert [g.payload for g in c.get("h", hashes)] == [b.payload for b in blocks]
    with KVStoreClient(server.address, shared_memory=False) as c:
        found, held = c.lookup_and_hold("h", hashes)
        assert found.num_hit == 2 and held is None
        assert len(server.engine.leases) == 0


def test_a_hold_asked_of_a_server_without_shared_memory_is_a_plain_lookup(
        server_factory: Any) -> None:
    srv = server_factory(dram={"enabled": False})
    blocks = make_chain(2, 1000, seed=28)
    with KVStoreClient(srv.address) as c:
        c.put("h", blocks)
    with grpc.insecure_channel(srv.address) as channel:
        resp = pb_grpc.KVStoreStub(channel).Lookup(pb.LookupRequest(
            namespace="h", block_hashes=[b.block_hash for b in blocks], hold=True))
    assert resp.num_hit == 2 and not resp.HasField("held")
    assert len(srv.engine.leases) == 0
