"""Names and ids a client chooses never collide (issue: ids that never collide), on a
real server under the default policy.

* A namespace holding ``|`` (the README's ``llama-8b|bf16|tp0/1``) is put as the
  connector puts (a lookup with a request id, then the blocks): the policy files the
  blocks under the request's session and values them as it does under a plain
  namespace, so they are written back to disk and survive a restart.
* Request ids are scoped by namespace: two engines on one sidecar, each numbering its
  requests "0", "1", ..., are two sets of requests.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvstore import KVStoreClient, Medium
from kvstore.types import SessionKey
from tests.blocks import make_chain
from tests.conftest import ServerThread

README_NS = "llama-8b|bf16|tp0/1"


@pytest.mark.parametrize("shared_memory", [False, True], ids=["grpc", "shm"])
def test_a_bar_namespace_is_written_back_and_survives_a_restart_as_a_plain_one(
        server_factory: Any, shared_memory: bool) -> None:
    srv = server_factory()
    chains = {ns: make_chain(20, 64 * 1024, seed=i) for i, ns in enumerate(["plain", README_NS])}
    with KVStoreClient(srv.address, shared_memory=shared_memory) as c:
        for i, (ns, blocks) in enumerate(chains.items()):
            hashes = [b.block_hash for b in blocks]
            assert c.lookup(ns, hashes, request_id=f"r{i}").store_blocks == 20
            assert c.put(ns, blocks, request_id=f"r{i}") == 20
    # Write-back is queued at the put for every block the policy values: let it run
    # (no waiting on a timer: a block the policy values at nothing is never queued).
    srv.drain()
    eng = srv.engine
    on_disk = {ns: sum("disk" in e.tiers for e in eng.index.entries(ns)) for ns in chains}
    assert on_disk == {"plain": 20, README_NS: 20}
    assert {e.meta.session_id for e in eng.index.entries(README_NS)} \
        == {e.meta.session_id for e in eng.index.entries("plain")} == {"~0"}
    inner = eng.policy.inner  # the default guards the workload policy's bets: read theirs
    bets = getattr(inner, "bets", inner)
    policy_sessions = {o for t in bets._t.values() for o in t.owner.values()}
    assert policy_sessions == {SessionKey("plain", "~0"), SessionKey(README_NS, "~0")}
    cfg = srv.cfg
    srv.stop()

    again = ServerThread(cfg)  # the same data dir
    try:
        with KVStoreClient(again.address, shared_memory=False) as c:
            for ns, blocks in chains.items():
                found = c.lookup(ns, [b.block_hash for b in blocks])
                assert found.num_hit == 20 and set(found.media) == {Medium.DISK}, ns
                got = c.get(ns, [b.block_hash for b in blocks])
                assert [g.payload if g else None for g in got] == [b.payload for b in blocks]
    finally:
        again.stop()


A_BLOCKS, B_BLOCKS = make_chain(4, 4096, seed=1), make_chain(4, 4096, seed=2)
A_HASHES = [b.block_hash for b in A_BLOCKS]
B_HASHES = [b.block_hash for b in B_BLOCKS]


def _engine_a(c: KVStoreClient) -> None:
    """Engine A's first request, "0": looked up, then stored."""
    assert c.lookup("engine-a", A_HASHES, "conv-a", "chat", request_id="0").store_blocks == 4
    assert c.put("engine-a", A_BLOCKS, request_id="0") == 4


def test_the_same_request_id_in_another_namespace_is_not_a_repeat(server: Any) -> None:
    with KVStoreClient(server.address) as c:
        _engine_a(c)
        # B's lookup: its own request, whose blocks the policy admits.
        assert c.lookup("engine-b", B_HASHES, "conv-b", "chat", request_id="0").store_blocks == 4


def test_blocks_are_filed_under_their_own_namespace_request(server: Any) -> None:
    eng = server.engine
    with KVStoreClient(server.address) as c:
        _engine_a(c)
        c.lookup("engine-b", B_HASHES, "conv-b", "chat", request_id="0")
        assert c.put("engine-b", B_BLOCKS, request_id="0") == 4
    assert {e.meta.session_id for e in eng.index.entries("engine-b")} == {"conv-b"}
    assert {e.meta.session_id for e in eng.index.entries("engine-a")} == {"conv-a"}


def test_a_session_end_by_request_id_ends_its_own_namespace_session(server: Any) -> None:
    eng = server.engine
    with KVStoreClient(server.address) as c:
        _engine_a(c)
        c.lookup("engine-b", B_HASHES, "conv-b", "chat", request_id="0")
        c.put("engine-b", B_BLOCKS, request_id="0")
        c.hint("", "session_end", namespace="engine-b", request_id="0")
        # B's session is over; A's session is live, and A's request still open: its own
        # hint (by request id alone) finds it.
        assert SessionKey("engine-b", "conv-b") not in eng.sessions._sessions
        assert SessionKey("engine-a", "conv-a") in eng.sessions._sessions
        c.hint("", "turn_end", namespace="engine-a", request_id="0")
        assert c.lookup("engine-a", A_HASHES).num_hit == 4
