"""Failures of Redis are misses and counters, never errors past the tier's contract nor
stalls past its deadline; the tier recovers by itself. Private servers on free ports."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kvstore.config import RedisConfig
from kvstore.errors import BlockNotFound, TierUnavailable
from kvstore.tiers.redis import RedisTier
from kvstore.types import BlockMeta
from tests.redis_servers import RedisCluster, RedisServer

from .conftest import block, key

#: Generous bound for "returned within its deadline": the deadline plus scheduling noise
#: on a busy 2-core machine (the property checked is "no stall", not a latency).
SLACK = 3.0


def config(**kw: Any) -> RedisConfig:
    base: dict[str, Any] = {"key_prefix": "kvfault", "capacity": 64 << 20, "timeout": 0.3,
                            "probe_timeout": 0.3, "connect_timeout": 0.3,
                            "retry_interval": 0.2, "chunk_bytes": 64 << 10}
    return RedisConfig(**{**base, **kw})


async def within(deadline: float, op: Awaitable[Any]) -> Any:
    t0 = time.monotonic()
    try:
        return await op
    finally:
        assert time.monotonic() - t0 < deadline + SLACK, "a call stalled past its deadline"


async def all_fail_open(tier: RedisTier, meta: BlockMeta, data: bytes) -> None:
    """Every operation answers within the deadline as a miss / skipped write."""
    d = tier.cfg.timeout
    with pytest.raises(BlockNotFound):
        await within(d, tier.get(meta.key))
    with pytest.raises(TierUnavailable):
        await within(d, tier.put(meta, data))
    assert not await within(d, tier.contains(meta.key))
    assert await within(d, tier.delete_many([key(77)])) == 0
    assert await within(d, tier.probe("model-a", [meta.key.block_hash])) == []


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "the tier did not recover by itself"
        await asyncio.sleep(0.1)


async def works(tier: RedisTier, i: int) -> bool:
    meta, data = block(i, 70_000)
    try:
        await tier.put(meta, data)
        return bytes(await tier.get(meta.key)) == data
    except (TierUnavailable, BlockNotFound):
        return False


async def test_redis_killed_mid_run_and_restarted(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r").start()
    tier = RedisTier(config(url=server.url))
    try:
        meta, data = block(1, 200_000)
        await tier.put(meta, data)
        server.kill9()
        await all_fail_open(tier, meta, data)
        c = tier.counters()
        assert c["unavailable"] + c.get("timeout", 0) >= 1 and c["skipped"] >= 1
        assert c["misses"] >= 1
        server.start()  # same port, empty
        await eventually(lambda: works(tier, 2))
        with pytest.raises(BlockNotFound):  # the restart lost it: a miss
            await tier.get(meta.key)
    finally:
        await tier.close()
        server.stop()


async def test_a_stalled_redis_costs_at_most_the_deadline(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r").start()
    tier = RedisTier(config(url=server.url))
    try:
        meta, data = block(1, 200_000)
        await tier.put(meta, data)
        server.pause()  # SIGSTOP: connections open, no answers
        await all_fail_open(tier, meta, data)
        assert tier.counters()["timeout"] >= 1
        server.resume()
        await eventually(lambda: works(tier, 2))
        assert bytes(await tier.get(meta.key)) == data
    finally:
        await tier.close()
        server.stop()


async def test_redis_at_maxmemory_refuses_writes_cleanly(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r", "--maxmemory", "3mb",
                         "--maxmemory-policy", "noeviction").start()
    tier = RedisTier(config(url=server.url))
    try:
        items = [block(i, 256 << 10) for i in range(24)]
        stored: list[BlockMeta] = []
        for meta, data in items:
            try:
                await tier.put(meta, data)
                stored.append(meta)
            except TierUnavailable as exc:
                assert "maxmemory" in str(exc)
        assert stored and len(stored) < len(items)
        assert tier.counters()["oom"] >= 1
        assert tier.used_bytes == sum(m.size for m in stored)
        for meta in stored:  # reads still work
            assert len(await tier.get(meta.key)) == meta.size
        refused = [m for m, _ in items if m not in stored]
        for meta in refused:  # no half-written block is left to find
            assert not await tier.contains(meta.key)
        assert await tier.probe("model-a", [m.key.block_hash for m in refused]) == []
    finally:
        await tier.close()
        server.stop()


async def test_a_cluster_master_killed_fails_over_and_the_tier_recovers(tmp_path: Path) -> None:
    cluster = RedisCluster(tmp_path / "c", masters=3, replicas=1).start()
    tier = RedisTier(config(cluster_nodes=tuple(cluster.addresses), timeout=0.5))
    try:
        items = [block(i, 70_000) for i in range(30)]  # spread over the three masters
        await tier.put_many(items)
        victim = cluster.master_of(tier._keys.header(items[0][0].key))
        victim.kill9()
        t0 = time.monotonic()
        outcomes = {"ok": 0, "miss": 0}
        while time.monotonic() - t0 < 1.5:  # during the failover: misses, not errors
            for meta, _ in items:
                try:
                    await within(tier.cfg.timeout, tier.get(meta.key))
                    outcomes["ok"] += 1
                except BlockNotFound:
                    outcomes["miss"] += 1
        assert outcomes["miss"] >= 1
        await asyncio.to_thread(cluster.wait_ok)
        await eventually(lambda: works(tier, 100))
        fresh = [block(200 + i, 70_000) for i in range(30)]
        await eventually(lambda: _put_all(tier, fresh))
        assert [bytes(p) for p in await tier.get_many([m.key for m, _ in fresh])] == \
            [d for _, d in fresh]
        c = tier.counters()
        assert c["misses"] >= 1 and c.get("unavailable", 0) + c.get("timeout", 0) >= 1
    finally:
        await tier.close()
        cluster.stop()


async def _put_all(tier: RedisTier, items: list[tuple[BlockMeta, bytes]]) -> bool:
    try:
        await tier.put_many(items)
        return True
    except TierUnavailable:
        return False
