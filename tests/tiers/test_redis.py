"""The redis tier beyond the conformance suite: layout, verification, TTLs, probe/adopt,
the per-sidecar budget; on the shared Redis and on a real Redis Cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
import redis as redis_py
import xxhash

from kvstore.errors import BlockNotFound, DataCorruption, TierUnavailable
from kvstore.tiers.base import CountingTier, SharedTier
from kvstore.tiers.redis import RedisTier
from kvstore.tiers.redisformat import KeyNames, decode_header
from kvstore.types import BlockKey

from .conftest import block, key, make_redis_tier, meta_for, payload

CHUNK = 64 << 10
CAP = 64 << 20


@pytest.fixture(params=["redis", "redis-cluster"])
async def rtier(request: pytest.FixtureRequest) -> AsyncIterator[RedisTier]:
    t, cleanup = make_redis_tier(request, CAP, chunk_bytes=CHUNK, ttl_seconds=600.0)
    assert isinstance(t, RedisTier)
    try:
        yield t
    finally:
        await t.close()
        cleanup()


def raw(t: RedisTier) -> Any:
    """A plain synchronous client on the tier's Redis (or one node of its Cluster)."""
    if t.cfg.cluster_nodes:
        host, _, port = t.cfg.cluster_nodes[0].rpartition(":")
        return redis_py.RedisCluster(host=host, port=int(port))
    return redis_py.Redis.from_url(t.cfg.url)


def names(t: RedisTier) -> KeyNames:
    return KeyNames(t.cfg.key_prefix)


async def test_capabilities(rtier: RedisTier) -> None:
    assert isinstance(rtier, SharedTier) and isinstance(rtier, CountingTier)
    assert rtier.medium.value == "REMOTE"


async def test_a_large_block_is_chunked_under_one_hash_tag(rtier: RedisTier) -> None:
    meta, data = block(1, 5 * CHUNK + 123)
    await rtier.put(meta, data)
    n = names(rtier)
    with raw(rtier) as r:
        chunks = [r.get(k) for k in n.chunks(meta.key, 7)]
        assert [len(c) for c in chunks[:6]] == [CHUNK] * 5 + [123] and chunks[6] is None
        header = decode_header(r.get(n.header(meta.key)))
        assert header.meta == meta and header.chunks == 6
        slots = {r.cluster_keyslot(k) if hasattr(r, "cluster_keyslot") else 0
                 for k in [n.header(meta.key), *n.chunks(meta.key, 6)]}
        assert len(slots) == 1  # one slot: one node, one pipeline
        assert 0 < r.pttl(n.header(meta.key)) <= 600_000
    assert bytes(await rtier.get(meta.key)) == data
    # Replacing it with a smaller value removes the chunks it no longer has.
    small = payload(2, 100)
    await rtier.put(meta_for(meta.key, small), small)
    assert bytes(await rtier.get(meta.key)) == small
    with raw(rtier) as r:
        assert [r.exists(k) for k in n.chunks(meta.key, 6)] == [1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("where", ["payload", "header", "missing-chunk"])
async def test_a_bad_value_is_a_miss_deleted_and_counted(rtier: RedisTier, where: str) -> None:
    meta, data = block(1, 3 * CHUNK)
    await rtier.put(meta, data)
    n = names(rtier)
    with raw(rtier) as r:
        if where == "payload":
            r.setrange(n.chunks(meta.key, 2)[1], 10, b"\x00\xff")
        elif where == "header":
            r.setrange(n.header(meta.key), 60, b"\xee")
        else:
            r.delete(n.chunks(meta.key, 3)[2])
    expected = BlockNotFound if where == "missing-chunk" else DataCorruption
    with pytest.raises(expected):
        await rtier.get(meta.key)
    counters = rtier.counters()
    assert counters["torn" if where == "missing-chunk" else "corrupt"] == 1
    with raw(rtier) as r:  # deleted: nobody else is served it either
        assert not r.exists(n.header(meta.key))
    assert rtier.used_bytes == 0
    with pytest.raises(BlockNotFound):
        await rtier.get(meta.key)


async def test_the_payload_must_match_its_checksum_before_writing(rtier: RedisTier) -> None:
    meta, data = block(1, 1000)
    with pytest.raises(DataCorruption):
        await rtier.put(meta, data[:-1] + b"?")
    assert rtier.used_bytes == 0 and not await rtier.contains(meta.key)


async def test_tenants_never_see_each_other_even_under_a_colliding_tag(rtier: RedisTier) -> None:
    a = key(1, "tenant-a")
    data = payload(1, 2000)
    await rtier.put(meta_for(a, data), data)
    b = key(1, "tenant-b")
    n = names(rtier)
    with raw(rtier) as r:  # tenant b's names made to hold tenant a's value
        for src, dst in zip([n.header(a), *n.chunks(a, 1)], [n.header(b), *n.chunks(b, 1)],
                            strict=True):
            r.set(dst, r.get(src))
    with pytest.raises(BlockNotFound):
        await rtier.get(b)
    assert await rtier.probe("tenant-b", [b.block_hash]) == []


async def test_probe_finds_the_leading_run_with_metadata_and_adopt_counts_it(
        rtier: RedisTier) -> None:
    items = [block(i, 1000 + i, parent_hash=key(i - 1).block_hash if i else None)
             for i in range(4)]
    await rtier.put_many(items[:3])
    other = RedisTier(rtier.cfg)  # another sidecar on the same store
    try:
        hashes = [m.key.block_hash for m, _ in items]
        found = await other.probe("model-a", hashes)
        assert [f.meta for f in found] == [m for m, _ in items[:3]]
        assert all(f.ttl_s is not None and 0 < f.ttl_s <= 600 for f in found)
        assert other.used_bytes == 0
        for f in found:
            other.adopt(f)
        assert other.used_bytes == sum(m.size for m, _ in items[:3])
        assert [bytes(p) for p in await other.get_many([m.key for m, _ in items[:3]])] == \
            [d for _, d in items[:3]]
        assert await other.probe("model-a", hashes[1:]) != []
        assert await other.probe("model-a", [hashes[3], *hashes[:3]]) == []
        assert other.counters()["probe_hits"] == 5
    finally:
        await other.close()


async def test_ttls_default_per_block_renewed_and_expired(rtier: RedisTier) -> None:
    now = [1000.0]
    tier = RedisTier(rtier.cfg, clock=lambda: now[0])
    try:
        tier.ttl_for = lambda meta: 5.0 if meta.session_id == "s1" else None
        items = [block(i, 1000) for i in range(3)]
        await tier.put_many(items)
        n = names(tier)
        with raw(tier) as r:
            ttls = [r.pttl(n.header(m.key)) for m, _ in items]
        assert 0 < ttls[1] <= 5000 and 5000 < ttls[0] <= 600_000 and ttls[2] > 5000
        assert await tier.set_ttl([items[2][0].key], 2.0) == 1
        with raw(tier) as r:
            assert 0 < r.pttl(n.header(items[2][0].key)) <= 2000
        now[0] += 3.0
        assert tier.expired() == [items[2][0].key]
        now[0] += 3.0
        assert tier.expired() == [items[1][0].key]
        assert tier.used_bytes == 1000
        with raw(tier) as r:
            r.pexpire(n.header(items[0][0].key), 100_000)  # as if time had passed in Redis
        await tier.get(items[0][0].key)  # 594 s of 600 left: no renewal yet
        assert "renewed" not in tier.counters()
        now[0] += 400.0
        await tier.get(items[0][0].key)  # 194 s left: renewed to 600 s
        assert tier.counters()["renewed"] == 1
        with raw(tier) as r:
            assert r.pttl(n.header(items[0][0].key)) > 500_000
        now[0] += 590.0
        assert tier.expired() == []
        assert tier.counters()["expired"] == 2
    finally:
        await tier.close()


async def test_the_budget_is_this_sidecars_share(rtier: RedisTier) -> None:
    other = RedisTier(replace(rtier.cfg, capacity=4000))
    try:
        await rtier.put(*block(1, 3000))
        assert other.used_bytes == 0 and other.can_fit(4000)
        await other.put(*block(2, 3000))
        assert not other.can_fit(1001) and other.can_fit(1000)
        assert rtier.used_bytes == 3000
        assert await other.delete(key(1))  # deleting a block it never wrote still works
        assert rtier.used_bytes == 3000  # the writer learns on its next read
        with pytest.raises(BlockNotFound):
            await rtier.get(key(1))
        assert rtier.used_bytes == 0
    finally:
        await other.close()


async def test_closed_tier_refuses_writes_and_misses_reads(rtier: RedisTier) -> None:
    meta, data = block(1, 100)
    await rtier.put(meta, data)
    await rtier.close()
    with pytest.raises(TierUnavailable):
        await rtier.put(meta, data)
    with pytest.raises(BlockNotFound):
        await rtier.get(meta.key)
    assert not await rtier.contains(meta.key)


def test_keys_are_tagged_by_namespace_and_hash() -> None:
    k = BlockKey("ns", b"\xab" * 32)
    n = KeyNames("p")
    tag = xxhash.xxh3_64_hexdigest(b"ns")
    assert n.header(k) == f"p:{{{tag}.{'ab' * 32}}}:h".encode()
    assert n.chunks(k, 2) == [f"p:{{{tag}.{'ab' * 32}}}:{i}".encode() for i in range(2)]
