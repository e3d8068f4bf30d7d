"""Fixtures shared by the tier tests: block metadata and one factory per tier."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import xxhash

from kvstore.tiers.base import Tier
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.dram import DramTier
from kvstore.tiers.memory import MemoryTier
from kvstore.types import BlockKey, BlockMeta, Workload

#: Small tiers keep the suite fast: 1 MiB of payload.
CAPACITY = 1 << 20


def key(i: int, namespace: str = "model-a") -> BlockKey:
    return BlockKey(namespace, i.to_bytes(32, "big"))


def meta_for(k: BlockKey, payload: bytes | memoryview, **kw: object) -> BlockMeta:
    view = memoryview(payload).cast("B")
    fields: dict[str, object] = {
        "key": k,
        "parent_hash": None,
        "token_ids": tuple(range(16)),
        "size": view.nbytes,
        "checksum": xxhash.xxh3_64_intdigest(view),
    }
    fields.update(kw)
    return BlockMeta(**fields)  # type: ignore[arg-type]


def payload(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "big") * (size // 4 + 1))[:size]


def block(i: int, size: int, **kw: object) -> tuple[BlockMeta, bytes]:
    data = payload(i, size)
    return meta_for(key(i), data, session_id=f"s{i}", workload=Workload.CHAT, **kw), data


TierFactory = Callable[[int], Tier]


def make_tier(kind: str, capacity: int, tmp_path: Path) -> Tier:
    if kind == "memory":
        return MemoryTier(capacity)
    if kind == "dram":
        return DramTier(capacity, segment_prefix="kvtest")
    if kind == "disk":
        return DiskTier(tmp_path / "disk", capacity)
    raise ValueError(kind)


def make_redis_tier(request: pytest.FixtureRequest, capacity: int, **cfg: object
                    ) -> tuple[Tier, Callable[[], None]]:
    """A redis tier on the shared Redis (``redis``) or the session's Redis Cluster
    (``redis-cluster``) under a key prefix of its own; the second value removes its keys."""
    from kvstore.config import RedisConfig
    from kvstore.tiers.redis import RedisTier
    from tests.redis_servers import SHARED_PORT, delete_prefix

    prefix = f"kvtest-{uuid.uuid4().hex[:12]}"
    if request.param == "redis-cluster":
        cluster = request.getfixturevalue("redis_cluster")
        conf = RedisConfig(cluster_nodes=tuple(cluster.addresses[:1]), key_prefix=prefix,
                           capacity=capacity, **cfg)  # type: ignore[arg-type]
        ports = [n.port for n in cluster.alive()]
    else:
        url = request.getfixturevalue("redis_url")
        conf = RedisConfig(url=url, key_prefix=prefix, capacity=capacity,
                           **cfg)  # type: ignore[arg-type]
        ports = [int(url.rsplit(":", 1)[1].split("/")[0]) if url else SHARED_PORT]
    return RedisTier(conf), lambda: delete_prefix(ports, prefix)


@pytest.fixture(params=["memory", "dram", "disk", "redis", "redis-cluster"])
async def tier(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Tier]:
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    if request.param.startswith("redis"):
        # Small chunks: the suite's larger blocks are split, as big KV blocks are.
        t, cleanup = make_redis_tier(request, CAPACITY, chunk_bytes=64 << 10)
    else:
        t = make_tier(request.param, CAPACITY, tmp_path)
    try:
        yield t
    finally:
        await t.close()
        cleanup()


@pytest.fixture
async def dram() -> AsyncIterator[DramTier]:
    t = DramTier(CAPACITY, segment_prefix="kvtest")
    try:
        yield t
    finally:
        await t.close()


@pytest.fixture
async def disk(tmp_path: Path) -> AsyncIterator[DiskTier]:
    t = DiskTier(tmp_path / "disk", CAPACITY)
    try:
        yield t
    finally:
        await t.close()
