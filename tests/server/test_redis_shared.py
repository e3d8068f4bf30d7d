"""Two sidecars sharing one Redis (in-process servers): a prefix stored through one is found
by the other's Lookup as REMOTE, loaded and verified, and announced by both; failures of
Redis never reach a client."""

from __future__ import annotations

import time

import pytest

from kvstore import KVStoreClient, Medium
from kvstore.hashing import block_hash_to_int
from tests.blocks import make_chain
from tests.redis_servers import RedisServer

from .redis_helpers import event_payloads, redis_section, stored, tier_blocks, wait_for

KiB = 2**10
NS = "llama|bf16|tp0/1"


@pytest.fixture
def pair(server_factory, redis_url, redis_prefix):
    """Sidecars A and B (own data dirs, DRAM + disk + the same Redis)."""
    redis = redis_section(redis_url, redis_prefix)
    return server_factory(redis=redis), server_factory(redis=redis)


def test_a_prefix_stored_on_one_host_is_found_loaded_and_announced_by_another(pair):
    a, b = pair
    blocks = make_chain(6, 256 * KiB, seed=3)
    hashes = [x.block_hash for x in blocks]
    with KVStoreClient(a.address) as ca, KVStoreClient(b.address) as cb:
        ca.put(NS, blocks)
        wait_for(lambda: tier_blocks(a.address, "redis") == 6, what="A's write-through")
        before = cb.lookup(NS, hashes + [b"\x07" * 32])  # one more block nobody has
        assert before.num_hit == 6 and set(before.media) == {Medium.REMOTE}
        got = cb.get(NS, hashes)  # shared memory: promoted into B's DRAM, verified
        assert [g.payload if g else None for g in got] == [x.payload for x in blocks]
        assert [tuple(g.token_ids) for g in got if g] == [tuple(x.token_ids) for x in blocks]
        assert [g.parent_hash for g in got if g] == [x.parent_hash for x in blocks]
        after = cb.lookup(NS, hashes)
        assert after.num_hit == 6 and set(after.media) == {Medium.CPU}
        st = cb.stats()
        assert st.tier("redis").blocks == 6 and st.tier("dram").blocks == 6
        assert st.tier("redis").used_bytes == 6 * 256 * KiB  # adopted into B's budget
    ints = {block_hash_to_int(h) for h in hashes}
    for srv in (a, b):  # both announce the blocks as REMOTE (and B then as CPU)
        payloads = event_payloads(srv.address, lambda evs: stored(evs, "REMOTE") >= ints)
        assert payloads
    b_events = event_payloads(b.address, lambda evs: stored(evs, "CPU") >= ints)
    assert b_events


def test_shared_lookup_extends_a_local_prefix_and_other_namespaces_stay_apart(pair):
    a, b = pair
    blocks = make_chain(5, 64 * KiB, seed=4)
    hashes = [x.block_hash for x in blocks]
    with KVStoreClient(a.address) as ca, KVStoreClient(b.address) as cb:
        cb.put(NS, blocks[:2])  # B has the head itself
        ca.put(NS, blocks)
        wait_for(lambda: tier_blocks(a.address, "redis") == 5, what="A's write-through")
        hit = cb.lookup(NS, hashes)
        assert hit.num_hit == 5
        assert hit.media[:2] == (Medium.CPU, Medium.CPU)
        assert set(hit.media[2:]) == {Medium.REMOTE}
        assert cb.lookup("another-tenant", hashes).num_hit == 0


def test_a_value_corrupted_inside_redis_is_never_served(pair, redis_url, redis_prefix):
    import redis as redis_py

    a, b = pair
    blocks = make_chain(3, 128 * KiB, seed=5)
    hashes = [x.block_hash for x in blocks]
    with KVStoreClient(a.address) as ca, KVStoreClient(b.address) as cb:
        ca.put(NS, blocks)
        wait_for(lambda: tier_blocks(a.address, "redis") == 3, what="A's write-through")
        # Flip one byte of block 1's payload inside Redis.
        with redis_py.Redis.from_url(redis_url) as r:
            (chunk,) = [k for k in r.scan_iter(match=f"{redis_prefix}:*{hashes[1].hex()}*:0")]
            r.setrange(chunk, 1000, bytes([r.getrange(chunk, 1000, 1000)[0] ^ 0xFF]))
        hit = cb.lookup(NS, hashes)
        assert hit.num_hit == 3
        got = cb.get(NS, hashes)
        assert got[0] is not None and got[0].payload == blocks[0].payload
        assert got[1] is None  # a miss, not an error, and not the bad bytes
        counters = b.run(_counters(b))
        assert counters.get("corrupt", 0) >= 1
        with redis_py.Redis.from_url(redis_url) as r:  # the bad value was deleted
            assert not list(r.scan_iter(match=f"{redis_prefix}:*{hashes[1].hex()}*"))
        assert cb.lookup(NS, hashes).num_hit == 1


async def _counters(srv) -> dict[str, int]:
    return dict(srv.engine.tiers["redis"].unwrap().counters())


def test_redis_killed_and_restarted_under_a_running_server(server_factory, tmp_path):
    redis = RedisServer(tmp_path / "redis").start()
    try:
        srv = server_factory(redis=redis_section(redis.url, "kvfault"))
        blocks = make_chain(8, 64 * KiB, seed=6)
        hashes = [x.block_hash for x in blocks]
        with KVStoreClient(srv.address) as c:
            c.put(NS, blocks[:4])
            wait_for(lambda: tier_blocks(srv.address, "redis") == 4, what="write-through")
            redis.kill9()
            t0 = time.monotonic()
            c.put(NS, blocks[4:])  # stored locally; the copies to Redis are skipped
            assert c.lookup(NS, hashes + [b"\x09" * 32]).num_hit == 8
            assert [g.payload for g in c.get(NS, hashes) if g] == [x.payload for x in blocks]
            srv.drain()
            assert time.monotonic() - t0 < 10
            counters = srv.run(_counters(srv))
            assert counters.get("unavailable", 0) + counters.get("skipped", 0) >= 1
            redis.start()  # same port, empty: the tier reconnects by itself
            time.sleep(0.3)  # past retry_interval
            more = make_chain(2, 64 * KiB, seed=7)
            c.put(NS, more)
            wait_for(lambda: srv.run(_counters(srv)).get("puts", 0) >= 6,
                     what="writes to the restarted Redis")
    finally:
        redis.stop()


def test_redis_at_maxmemory_is_a_skipped_copy(server_factory, tmp_path):
    redis = RedisServer(tmp_path / "redis", "--maxmemory", "3mb",
                        "--maxmemory-policy", "noeviction").start()
    try:
        srv = server_factory(redis=redis_section(redis.url, "kvoom"))
        blocks = make_chain(24, 256 * KiB, seed=8)  # 6 MiB into a 3 MiB Redis
        with KVStoreClient(srv.address) as c:
            c.put(NS, blocks)
            srv.drain()
            counters = srv.run(_counters(srv))
            assert counters.get("oom", 0) >= 1 and counters.get("puts", 0) >= 1
            assert c.lookup(NS, [x.block_hash for x in blocks]).num_hit == 24
            got = c.get(NS, [x.block_hash for x in blocks])
            assert [g.payload for g in got if g] == [x.payload for x in blocks]
        # What the tier counts is what is in Redis: no refused block left a header behind.
        headers = [k for k in redis.cli("--scan", "--pattern", "kvoom:*:h").split() if k]
        assert len(headers) == counters["puts"]
    finally:
        redis.stop()
