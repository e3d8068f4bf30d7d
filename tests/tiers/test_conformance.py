"""One suite, every tier: the behaviour the engine relies on, identical across tiers."""

from __future__ import annotations

import numpy as np
import pytest

from kvstore.errors import BlockNotFound, BlockTooLargeForTier, InvalidBlock, TierFull
from kvstore.tiers.base import Tier
from kvstore.types import BlockMeta

from .conftest import CAPACITY, block, key, meta_for, payload


async def test_round_trip(tier: Tier) -> None:
    meta, data = block(1, 4096)
    assert not await tier.contains(meta.key)
    await tier.put(meta, data)
    assert await tier.contains(meta.key)
    assert bytes(await tier.get(meta.key)) == data
    assert tier.used_bytes == 4096
    assert tier.capacity_bytes == CAPACITY


async def test_missing_block(tier: Tier) -> None:
    with pytest.raises(BlockNotFound):
        await tier.get(key(99))
    assert not await tier.delete(key(99))
    assert not await tier.contains(key(99))


async def test_replace(tier: Tier) -> None:
    meta, data = block(1, 1000)
    await tier.put(meta, data)
    new = payload(7, 3000)
    await tier.put(meta_for(meta.key, new), new)
    assert bytes(await tier.get(meta.key)) == new
    assert tier.used_bytes == 3000


async def test_delete(tier: Tier) -> None:
    meta, data = block(1, 5000)
    await tier.put(meta, data)
    assert await tier.delete(meta.key)
    assert not await tier.contains(meta.key)
    assert tier.used_bytes == 0
    with pytest.raises(BlockNotFound):
        await tier.get(meta.key)
    assert not await tier.delete(meta.key)


async def test_namespaces_do_not_mix(tier: Tier) -> None:
    a, b = key(1, "model-a"), key(1, "model-b")
    await tier.put(meta_for(a, b"a" * 100), b"a" * 100)
    await tier.put(meta_for(b, b"b" * 200), b"b" * 200)
    assert bytes(await tier.get(a)) == b"a" * 100
    assert bytes(await tier.get(b)) == b"b" * 200
    assert await tier.delete(a)
    assert await tier.contains(b)


async def test_capacity_exact(tier: Tier) -> None:
    sizes = [1000, 3001, 65536, 65536 * 3 + 17]
    sizes.append(CAPACITY - sum(sizes))
    for i, size in enumerate(sizes):
        assert tier.can_fit(size)
        await tier.put(*block(i, size))
    assert tier.used_bytes == CAPACITY
    assert not tier.can_fit(1)
    with pytest.raises(TierFull):
        await tier.put(*block(100, 1))
    assert tier.used_bytes == CAPACITY
    assert await tier.delete(key(0))
    assert tier.can_fit(1000)
    await tier.put(*block(100, 1000))
    assert tier.used_bytes == CAPACITY
    for i, size in enumerate(sizes[1:], start=1):
        assert bytes(await tier.get(key(i))) == payload(i, size)


async def test_one_block_of_the_whole_capacity(tier: Tier) -> None:
    meta, data = block(1, CAPACITY)
    await tier.put(meta, data)
    assert tier.used_bytes == CAPACITY
    # Replacing a key that fills the tier needs no extra room.
    other = payload(2, CAPACITY)
    await tier.put(meta_for(meta.key, other), other)
    assert bytes(await tier.get(meta.key)) == other
    assert tier.used_bytes == CAPACITY


async def test_block_larger_than_the_tier(tier: Tier) -> None:
    assert not tier.can_fit(CAPACITY + 1)
    with pytest.raises(BlockTooLargeForTier):
        await tier.put(*block(1, CAPACITY + 1))
    assert tier.used_bytes == 0
    assert not await tier.contains(key(1))


async def test_invalid_payloads(tier: Tier) -> None:
    with pytest.raises(InvalidBlock):
        await tier.put(meta_for(key(1), b""), b"")
    meta, data = block(1, 100)
    with pytest.raises(InvalidBlock):
        await tier.put(meta, data + b"x")
    assert tier.used_bytes == 0


async def test_buffer_payloads_are_copied(tier: Tier) -> None:
    arr = np.arange(512, dtype=np.float16)  # a non-byte buffer format
    meta = meta_for(key(1), arr.data)
    await tier.put(meta, arr.data)
    expected = arr.tobytes()
    arr[:] = 0  # the tier must not alias the caller's buffer
    assert bytes(await tier.get(meta.key)) == expected
    assert tier.used_bytes == arr.nbytes

    buf = bytearray(b"x" * 64)
    await tier.put(meta_for(key(2), memoryview(buf)), memoryview(buf))
    buf[:] = b"y" * 64
    assert bytes(await tier.get(key(2))) == b"x" * 64


async def test_batches(tier: Tier) -> None:
    items = [block(i, 1000 + i) for i in range(8)]
    await tier.put_many(items)
    assert tier.used_bytes == sum(m.size for m, _ in items)
    got = await tier.get_many([m.key for m, _ in items])
    assert [bytes(g) for g in got] == [d for _, d in items]
    assert await tier.delete_many([m.key for m, _ in items[:5]] + [key(99)]) == 5
    assert tier.used_bytes == sum(m.size for m, _ in items[5:])


async def test_batch_refused_when_over_capacity(tier: Tier) -> None:
    items: list[tuple[BlockMeta, bytes]] = [block(i, CAPACITY // 2) for i in range(3)]
    with pytest.raises(TierFull):
        await tier.put_many(items)
    assert tier.used_bytes == 2 * (CAPACITY // 2)


async def test_close_is_idempotent(tier: Tier) -> None:
    await tier.put(*block(1, 100))
    await tier.close()
    await tier.close()
