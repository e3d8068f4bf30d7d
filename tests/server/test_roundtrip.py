"""Round trips through a real ``kvstore serve`` process, both data paths."""

from __future__ import annotations

import pytest

from kvstore import KVStoreClient, Medium
from tests.blocks import make_chain

MiB = 2**20


@pytest.mark.slow
@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "grpc"])
def test_thousand_1mib_blocks_round_trip(server_process, shared_memory):
    srv = server_process(KVSTORE_DRAM__CAPACITY="1100MiB", KVSTORE_DISK__CAPACITY="2GiB")
    blocks = make_chain(1000, MiB, seed=1 if shared_memory else 2)
    with KVStoreClient(srv.address, shared_memory=shared_memory) as c:
        assert c.uses_shared_memory is shared_memory
        assert c.put("model-a", blocks) == 1000
        hashes = [b.block_hash for b in blocks]
        found = c.lookup("model-a", hashes)
        assert found.num_hit == 1000
        assert set(found.media) <= {Medium.CPU, Medium.DISK}
        got = c.get("model-a", hashes)
        assert [g.payload if g else None for g in got] == [b.payload for b in blocks]
        assert [tuple(g.token_ids) for g in got if g] == [tuple(b.token_ids) for b in blocks]
        assert [g.parent_hash for g in got if g] == [b.parent_hash for b in blocks]
        # A second put of the same blocks stores nothing new.
        assert c.put("model-a", blocks[:10]) == 0
        st = c.stats()
        assert st.blocks == 1000


def test_lookup_stops_at_first_miss(server):
    blocks = make_chain(8, 4096)
    with KVStoreClient(server.address) as c:
        c.put("ns", blocks[:3] + blocks[4:])
        r = c.lookup("ns", [b.block_hash for b in blocks])
        assert r.num_hit == 3 and r.media == (Medium.CPU,) * 3
        got = c.get("ns", [b.block_hash for b in blocks])
        assert got[3] is None and all(g is not None for i, g in enumerate(got) if i != 3)


def test_namespaces_never_mix(server):
    blocks = make_chain(4, 1024)
    with KVStoreClient(server.address) as c:
        c.put("model-a", blocks)
        assert c.lookup("model-b", [b.block_hash for b in blocks]).num_hit == 0
        c.put("model-b", blocks[:1])
        assert c.delete("model-a") == 4
        assert c.lookup("model-a", [b.block_hash for b in blocks]).num_hit == 0
        assert c.lookup("model-b", [b.block_hash for b in blocks]).num_hit == 1


async def test_async_client_both_paths(server):
    from kvstore import AsyncKVStoreClient

    for shm in (True, False):
        blocks = make_chain(20, 64 * 1024, seed=7 + shm)
        async with AsyncKVStoreClient(server.address, shared_memory=shm) as c:
            assert await c.uses_shared_memory() is shm
            assert await c.put(f"ns{shm}", blocks) == 20
            assert (await c.lookup(f"ns{shm}", [b.block_hash for b in blocks])).num_hit == 20
            got = await c.get(f"ns{shm}", [b.block_hash for b in blocks])
            assert [g.payload for g in got if g] == [b.payload for b in blocks]
            assert (await c.stats()).blocks >= 20


def test_dram_eviction_demotes_to_disk_and_reads_back(server_factory):
    srv = server_factory(dram={"capacity": "8MiB"}, disk={"capacity": "64MiB"},
                         engine={"policy": "lru"})
    chains = [make_chain(8, MiB, seed=s) for s in range(3)]  # three requests, 24 MiB
    blocks = [b for chain in chains for b in chain]
    with KVStoreClient(srv.address) as c:
        assert sum(c.put("ns", chain) for chain in chains) == 24
        srv.drain()
        st = c.stats()
        assert st.tier("dram").used_bytes <= 8 * MiB
        assert st.tier("dram").evictions > 0
        media = [m for chain in chains
                 for m in c.lookup("ns", [b.block_hash for b in chain]).media]
        assert len(media) == 24 and Medium.DISK in media
        got = c.get("ns", [b.block_hash for b in blocks])  # promotes from disk via shm
        assert [g.payload for g in got if g] == [b.payload for b in blocks]
