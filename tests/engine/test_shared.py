"""The engine's side of the shared tier (kvstore.engine.shared) over a real Redis: lookups
extended by a probe, the cost gate, write-through, TTL expiry forgetting, and a Redis that
is down never turning into an error."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from kvstore.policies import Plan, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.lru import LRUPolicy

from kvstore.config import RedisConfig
from kvstore.engine.core import Engine
from kvstore.engine.shared import SharedPrefix
from kvstore.events import RecordingSink
from kvstore.tiers.memory import MemoryTier
from kvstore.tiers.redis import RedisTier
from kvstore.types import Medium
from tests.redis_servers import RedisServer, delete_prefix

from .test_engine import Clock, new_blocks

KiB = 1024


def sidecar(cfg: RedisConfig, clock: Clock, policy_cls: type[LRUPolicy] = LRUPolicy,
            prefill: float = 10_000.0, read_bw: float = 1e9
            ) -> tuple[Engine, RecordingSink, RedisTier]:
    dram = MemoryTier(4 << 20, name="dram", medium=Medium.CPU)
    redis = RedisTier(cfg, clock=clock)
    sink = RecordingSink()
    policy = policy_cls([TierSpec(t.name, t.capacity_bytes) for t in (dram, redis)])
    eng = Engine([dram, redis], policy, sink, clock=clock,
                 cost=CostModel(prefill_tokens_per_s=prefill), bandwidth={"redis": read_bw})
    eng.shared = SharedPrefix(eng, "redis")
    return eng, sink, redis


@pytest.fixture
async def cfg(redis_url: str) -> AsyncIterator[RedisConfig]:
    prefix = f"kvtest-{uuid.uuid4().hex[:12]}"
    yield RedisConfig(url=redis_url, key_prefix=prefix, capacity=64 << 20, ttl_seconds=30.0)
    delete_prefix([int(redis_url.rsplit(":", 1)[1].split("/")[0])], prefix)


def stored_on(sink: RecordingSink, medium: Medium) -> list[bytes]:
    return [m.key.block_hash for kind, items, med in sink.calls if kind == "stored"
            and med is medium for m in items]  # type: ignore[union-attr]


async def test_lookup_extends_into_the_shared_tier_and_adopts(cfg: RedisConfig) -> None:
    clock = Clock()
    a, _, _ = sidecar(cfg, clock)
    b, b_sink, b_redis = sidecar(cfg, clock)
    await a.start()
    await b.start()
    blocks = new_blocks(5, 8 * KiB, seed=1)
    hashes = [x.block_hash for x in blocks]
    await a.put("ns", blocks)
    await a.mover.drain()  # write-through: every block is in Redis
    assert all(e.tiers == ["dram", "redis"] for e in a.index.entries())
    assert b.lookup("ns", hashes) == []
    media = await b.shared.extend("ns", hashes, 0)  # type: ignore[union-attr]
    assert media == [Medium.REMOTE] * 5
    assert stored_on(b_sink, Medium.REMOTE) == hashes  # in chain order, parents first
    assert b_redis.used_bytes == 5 * 8 * KiB
    assert b.stats.lookup_hit_blocks == 5 and b.stats.lookup_miss_blocks == 0
    await b.mover.drain()  # the prefetch brought them into DRAM
    assert b.lookup("ns", hashes) == [Medium.CPU] * 5
    got = await b.get("ns", hashes)
    assert [g[1] if g else None for g in got] == [bytes(x.payload) for x in blocks]
    # Nothing more to find past the end; nothing found for another tenant.
    assert await b.shared.extend("ns", hashes, 5) == []  # type: ignore[union-attr]
    assert await b.shared.extend("other", hashes, 0) == []  # type: ignore[union-attr]
    await a.close()
    await b.close()


async def test_the_engines_lookup_extends_into_the_shared_tier_once_per_request(
        cfg: RedisConfig) -> None:
    """The lookup every caller makes (the servicer, the replay) runs the shared-tier
    extension itself: the store count loses what other hosts hold, and a repeat of the
    request is not counted again."""
    clock = Clock()
    a, _, _ = sidecar(cfg, clock)
    b, _, _ = sidecar(cfg, clock)
    await a.start()
    await b.start()
    blocks = new_blocks(4, 8 * KiB, seed=7)
    hashes = [x.block_hash for x in blocks]
    await a.put("ns", blocks[:3])
    await a.mover.drain()  # write-through: three blocks in Redis
    found = await b.serve_lookup("ns", hashes, request_id="r1")
    assert found.media == [Medium.REMOTE] * 3 and found.store == 1
    assert b.stats.lookups == 1 and b.stats.lookup_hit_blocks == 3
    assert b.stats.lookup_miss_blocks == 1
    again = await b.serve_lookup("ns", hashes, request_id="r1")
    assert again.repeat and len(again.media) == 3 and again.store == 1
    assert b.stats.lookup_hit_blocks == 3 and b.stats.lookup_miss_blocks == 1
    await a.close()
    await b.close()


async def test_a_hit_that_loses_to_recompute_is_not_reported(cfg: RedisConfig) -> None:
    clock = Clock()
    a, _, _ = sidecar(cfg, clock)
    # 8 KiB at 1 MB/s = 8 ms to load vs 16 tokens at 1M tokens/s = 16 us to recompute.
    b, b_sink, _ = sidecar(cfg, clock, prefill=1e6, read_bw=1e6)
    await a.start()
    await b.start()
    blocks = new_blocks(3, 8 * KiB, seed=2)
    await a.put("ns", blocks)
    await a.mover.drain()
    assert await b.shared.extend("ns", [x.block_hash for x in blocks], 0) == []  # type: ignore[union-attr]
    assert stored_on(b_sink, Medium.REMOTE) == [] and len(b.index) == 0
    await a.close()
    await b.close()


async def test_expired_blocks_are_forgotten_with_a_removed_event(cfg: RedisConfig) -> None:
    clock = Clock()
    eng, sink, redis = sidecar(replace(cfg, ttl_seconds=5.0), clock)
    await eng.start()
    blocks = new_blocks(2, 4 * KiB, seed=3)
    await eng.put("ns", blocks)
    await eng.mover.drain()
    assert redis.used_bytes == 8 * KiB
    clock.t += 6.0
    await eng.sweep()
    removed = [(items, med) for kind, items, med in sink.calls if kind == "removed"]
    assert [med for _, med in removed] == [Medium.REMOTE] * 2
    assert all(e.tiers == ["dram"] for e in eng.index.entries())
    assert redis.used_bytes == 0
    await eng.close()


async def test_redis_down_is_never_an_error(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r").start()
    clock = Clock()
    conf = RedisConfig(url=server.url, key_prefix="kvdown", timeout=0.3, probe_timeout=0.3,
                       retry_interval=0.0)
    eng, _, tier = sidecar(conf, clock)
    try:
        await eng.start()
        blocks = new_blocks(4, 4 * KiB, seed=5)
        hashes = [x.block_hash for x in blocks]
        await eng.put("ns", blocks[:2])
        await eng.mover.drain()
        server.kill9()
        await eng.put("ns", blocks[2:])  # stored in DRAM, the copies to Redis skipped
        await eng.mover.drain()
        assert eng.lookup("ns", hashes) == [Medium.CPU] * 4
        assert await eng.shared.extend("ns", hashes + [b"\x01" * 32], 4) == []  # type: ignore[union-attr]
        # A block the policy places in Redis alone is skipped, not an error.
        eng.policy.inner.on_request = lambda req, now: Plan(  # type: ignore[method-assign]
            dict.fromkeys(req.keys, "redis"))
        more = new_blocks(2, 4 * KiB, seed=6)
        assert await eng.put("ns", more) == (0, 0)
        # A read of a block only in Redis is a miss.
        entry = next(e for e in eng.index.entries() if e.key.block_hash == hashes[0])
        await eng.placement._drop(entry.key, "dram")
        got = await eng.get("ns", hashes)
        assert got[0] is None and all(g is not None for g in got[1:])
        counters = tier.counters()
        assert counters.get("unavailable", 0) + counters.get("timeout", 0) >= 1
    finally:
        await eng.close()
        server.stop()
