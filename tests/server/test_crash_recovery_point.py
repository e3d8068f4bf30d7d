"""The recovery point and the drain, on real ``kvstore serve`` processes with the default
config (the ``workload`` policy): what a put stored reaches disk within
``disk.max_write_delay_s`` whatever the policy values it at, and ``SIGTERM`` writes DRAM
back to disk before the process exits."""

from __future__ import annotations

import time

import pytest

from kvstore import KVStoreClient, Medium
from kvstore.config import load_config
from kvstore.errors import ConfigError
from tests.blocks import make_chain

pytestmark = pytest.mark.slow

#: The README's example namespace (it holds ``|``), and a plain one.
NAMESPACES = ("llama-8b|bf16|tp0/1", "m")


def _put_like_the_connector(c: KVStoreClient, n: int, seed: int) -> dict[str, list]:
    """Per namespace: a chain looked up with a request id, then put under it (no
    session id: the engine infers the session from the chain, as for vLLM's requests)."""
    chains = {}
    for i, ns in enumerate(NAMESPACES):
        blocks = make_chain(n, 64 * 1024, seed=seed + i)
        rid = f"req-{seed}-{i}"
        c.lookup(ns, [b.block_hash for b in blocks], request_id=rid)
        assert c.put(ns, blocks, request_id=rid) == n
        chains[ns] = blocks
    return chains


def _all_back(address: str, chains: dict[str, list]) -> None:
    with KVStoreClient(address) as c:
        for ns, blocks in chains.items():
            hashes = [b.block_hash for b in blocks]
            r = c.lookup(ns, hashes)
            assert r.num_hit == len(blocks), (ns, r.num_hit)
            assert set(r.media) == {Medium.DISK}
            got = c.get(ns, hashes)
            assert [g.payload if g else None for g in got] == [b.payload for b in blocks], ns


def test_blocks_reach_disk_by_the_recovery_point_and_survive_kill9(server_process, tmp_path):
    """Default config: put, wait past ``disk.max_write_delay_s`` (2 s) without asking the
    server anything, kill -9, restart: every block is there. (Before the recovery point
    the ``|`` namespace's blocks, valued at nothing by the default policy, never reached
    disk: 0 of them came back.)"""
    data = tmp_path / "data"
    srv = server_process(data_dir=data)
    with KVStoreClient(srv.address) as c:
        chains = _put_like_the_connector(c, 100, seed=11)
    time.sleep(2.0 + 2.0)  # the delay, and a margin for the sweep and the disk's writes
    srv.kill9()
    _all_back(server_process(data_dir=data, port=srv.port).address, chains)


def test_sigterm_right_after_a_put_drains_dram_to_disk(server_process, tmp_path):
    data = tmp_path / "data"
    srv = server_process(data_dir=data)  # server.drain_timeout_s = 20
    with KVStoreClient(srv.address) as c:
        chains = _put_like_the_connector(c, 200, seed=21)
    assert srv.proc is not None
    t0 = time.monotonic()
    srv.proc.terminate()
    assert srv.proc.wait(30) == 0
    assert time.monotonic() - t0 < 20 + 5  # the drain's bound, and the exit itself
    _all_back(server_process(data_dir=data, port=srv.port).address, chains)
    log = srv.log_path.read_text() if srv.log_path else ""
    assert "0 left unwritten" in log, log[-2000:]


def test_puts_are_refused_once_the_drain_began(server):
    from kvstore.errors import Unavailable

    blocks = make_chain(4, 4096, seed=3)
    with KVStoreClient(server.address) as shm, \
            KVStoreClient(server.address, shared_memory=False) as c:
        assert shm.uses_shared_memory
        c.put("m", blocks[:2])
        assert server.run(server.engine.drain(5.0)) == 0  # both written back
        for client in (c, shm):  # over gRPC, and the shared-memory reserve
            with pytest.raises(Unavailable, match="shutting down"):
                client.put("m", blocks[2:])
        got = c.get("m", [b.block_hash for b in blocks[:2]])  # reads are still served
        assert [g.payload if g else None for g in got] == [b.payload for b in blocks[:2]]
    assert all("disk" in e.tiers for e in server.engine.index.entries("m"))


def test_recovery_point_and_drain_settings_are_validated():
    with pytest.raises(ConfigError, match="disk.max_write_delay_s"):
        load_config(env={}, overrides={"disk": {"max_write_delay_s": -1}})
    with pytest.raises(ConfigError, match="server.drain_timeout_s"):
        load_config(env={}, overrides={"server": {"drain_timeout_s": 1, "grace_seconds": 5}})
    with pytest.raises(ConfigError, match="server.drain_timeout_s"):
        load_config(env={}, overrides={"server": {"drain_timeout_s": float("nan")}})
