"""Retention over the wire: Retain through the sync and async clients, retained bytes in
Stats and /metrics, the max TTL refused naming its setting (real server)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvstore import KVStoreClient
from kvstore.cli import main as cli_main
from kvstore.client import AsyncKVStoreClient
from kvstore.errors import InvalidArgument
from kvstore.metrics import EngineCollector
from kvstore.profile.text import format_profile
from tests.blocks import make_chain

KiB = 1024


def test_retain_protects_a_prefix_under_pressure_and_reports_it(server_factory, capsys):
    srv = server_factory(dram={"capacity": "2MiB"}, disk={"enabled": False},
                         engine={"policy": "lru"}, retention={"max_ttl_s": 900.0, "dram": "512KiB"})
    system = make_chain(4, 64 * KiB, seed=1)
    hashes = [b.block_hash for b in system]
    with KVStoreClient(srv.address, shared_memory=False) as c:
        c.put("m", system)
        assert c.retain("m", hashes, 300) == 4
        more = make_chain(8, 64 * KiB, seed=2)
        assert c.retain("m", [b.block_hash for b in more], 300) == 0  # not stored yet
        c.put("m", more)  # now stored: 4 of them fit the 512 KiB quota with the 4 above
        for i in range(10):  # 2.5 MiB of unretained blocks through a 2 MiB tier
            c.put("m", make_chain(4, 64 * KiB, seed=100 + i))
        assert c.lookup("m", hashes).num_hit == 4
        st = c.stats()
        assert [(u.tenant, u.tier, u.retained_bytes, u.limit_bytes) for u in st.retention] == [
            ("m", "dram", 512 * KiB, 512 * KiB)]
        assert st.retained_granted == 8 and st.retained_refused == 4
        assert st.retained_returned >= 4 and st.tier("dram").evictions > 0
        with pytest.raises(InvalidArgument, match=r"retention\.max_ttl_s = 900"):
            c.retain("m", hashes, 3600)
        # the profile: 8 distinct blocks retained, the 4 looked up came back
        prof = c.profile()
        assert (prof.retained_blocks, prof.retained_came_back) == (8, 4)
        assert "came back while retained  4 (50.0%)" in format_profile(prof)
    assert cli_main(["stats", "--address", srv.address]) == 0
    out = capsys.readouterr().out
    assert "retained by 'm' in dram: 524,288 / 524,288 bytes" in out
    assert "retention: granted 8  refused 4" in out
    registry = CollectorRegistry()
    registry.register(EngineCollector(srv.engine))
    text = srv.run(asyncio.to_thread(generate_latest, registry)).decode()
    assert 'kvstore_retained_bytes{tenant="m",tier="dram"} 524288.0' in text
    assert "kvstore_retained_granted_total 8.0" in text


def test_the_async_client_retains_too(server_factory):
    srv = server_factory(dram={"capacity": "2MiB"}, disk={"enabled": False})
    blocks = make_chain(2, 64 * KiB, seed=3)

    async def go() -> tuple[int, int]:
        async with AsyncKVStoreClient(srv.address, shared_memory=False) as c:
            await c.put("m", blocks)
            got = await c.retain("m", [b.block_hash for b in blocks], 60)
            return got, await c.retain("m", [b.block_hash for b in blocks], 0)

    assert asyncio.run(go()) == (2, 0)
