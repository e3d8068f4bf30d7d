"""The DRAM pool allocator (TLSF): invariants, coalescing, and mixed sizes at >= 90%."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from kvstore.errors import TierFull
from kvstore.tiers.dram import DramTier
from kvstore.tiers.slab import SlabAllocator
from kvstore.tiers.tlsf import GRANULE, Allocation, TlsfAllocator
from kvstore.tools.tiers.alloc import SIZE_MIXES, model_block_sizes
from kvstore.types import BlockKey, BlockMeta

KiB, MiB = 1 << 10, 1 << 20


def test_model_block_sizes_are_vllms() -> None:
    sizes = model_block_sizes()
    assert sizes["Llama-3-8B bf16"] == 2 * MiB  # 2 x 32 layers x 8 heads x 128 x 16 x 2 B
    assert sizes["Qwen2.5-7B fp8"] == 448 * KiB
    assert sizes["Llama-3-70B TP4 bf16"] == 1280 * KiB


def _check_disjoint(live: dict[int, Allocation], pool: int) -> None:
    spans = sorted((a.offset, a.offset + a.slot_size) for a in live.values())
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start
    assert all(s >= 0 and e <= pool and s % GRANULE == 0 for s, e in spans)


def test_random_alloc_free_keeps_ranges_disjoint_and_coalesces() -> None:
    pool = 8 * MiB
    a = TlsfAllocator(pool)
    r = random.Random(1)
    live: dict[int, Allocation] = {}
    for step in range(4000):
        if live and r.random() < 0.45:
            k = r.choice(list(live))
            a.free(live.pop(k))
        else:
            size = r.choice([r.randint(1, 4 * KiB), r.randint(1, 512 * KiB)])
            got = a.alloc(size)
            if got is not None:
                assert got.slot_size >= size and got.slot_size - size < GRANULE
                live[step] = got
        if step % 500 == 0:
            _check_disjoint(live, pool)
            assert a.free_bytes == pool - sum(x.slot_size for x in live.values())
    for alloc in live.values():
        a.free(alloc)
    assert a.free_bytes == pool and a.free_ranges == 1 and a.largest_free == pool


def test_neighbours_coalesce_and_the_whole_pool_is_usable() -> None:
    a = TlsfAllocator(8 * 64 * KiB)
    blocks = [a.alloc(64 * KiB) for _ in range(8)]
    assert all(b is not None for b in blocks) and a.alloc(1) is None
    assert not a.can_alloc(1)
    for b in blocks[2:5]:
        assert b is not None
        a.free(b)
    assert a.can_alloc(3 * 64 * KiB) and not a.can_alloc(3 * 64 * KiB + 1)
    three = a.alloc(3 * 64 * KiB)
    assert three is not None and three.offset == 2 * 64 * KiB


def test_a_run_is_adjacent_slots_each_freed_alone() -> None:
    a = TlsfAllocator(8 * 64 * KiB)
    run = a.alloc_run([64 * KiB, 100, 64 * KiB])
    assert run is not None
    assert [(x.offset, x.slot_size) for x in run] == [
        (0, 64 * KiB), (64 * KiB, 2 * GRANULE), (64 * KiB + 2 * GRANULE, 64 * KiB)]
    assert a.free_bytes == 8 * 64 * KiB - 128 * KiB - 2 * GRANULE
    a.free(run[1])  # the middle one alone: a hole between live neighbours
    assert a.free_ranges == 2
    with pytest.raises(ValueError):
        a.free(run[1])
    a.free(run[0])
    a.free(run[2])
    assert a.free_ranges == 1 and a.free_bytes == 8 * 64 * KiB  # all coalesced back
    # No free range holds the run whole: nothing is taken (one by one still fits).
    halves = [a.alloc(64 * KiB) for _ in range(8)]
    for h in halves[::2]:
        assert h is not None
        a.free(h)
    assert a.alloc_run([64 * KiB, 64 * KiB]) is None and a.free_bytes == 4 * 64 * KiB
    assert a.alloc_run([]) is None


def test_exact_fit_in_a_request_s_own_class() -> None:
    # A free range whose class also holds smaller ranges is still found for a request
    # that is not a class boundary (the rounded search alone would miss it).
    a = TlsfAllocator(1000 * GRANULE)
    first = a.alloc(37 * GRANULE)
    rest = a.alloc(963 * GRANULE)
    assert first is not None and rest is not None and a.free_bytes == 0
    a.free(first)
    assert a.alloc(37 * GRANULE) == first


def test_double_free_and_foreign_allocations_are_refused() -> None:
    a = TlsfAllocator(MiB)
    x = a.alloc(1000)
    assert x is not None
    a.free(x)
    with pytest.raises(ValueError):
        a.free(x)
    with pytest.raises(ValueError):
        a.free(Allocation(4096, 1024))


def test_previous_slab_allocator_still_coalesces_pages() -> None:
    page = 256 * KiB  # the scheme the benchmark compares against
    alloc = SlabAllocator(8 * page, page)
    big = [alloc.alloc(2 * page) for _ in range(4)]
    assert all(b is not None for b in big) and alloc.alloc(1) is None
    for b in big[1:3]:
        assert b is not None
        alloc.free(b)
    four = alloc.alloc(4 * page)
    assert four is not None and four.offset == 2 * page


def _meta(i: int, size: int) -> BlockMeta:
    return BlockMeta(BlockKey("mixed", i.to_bytes(32, "big")), None, (), size, 0)


@pytest.mark.parametrize("mix", ["models (6 sizes)", "models + random 1 KiB-2 MiB",
                                 "random 16-256 KiB"])
async def test_dram_holds_mixed_sizes_above_90_percent(mix: str) -> None:
    """Fill a 64 MiB tier with mixed block sizes until it refuses, then churn it
    (evict the oldest until the next block fits): >= 90% of the pool holds payload."""
    capacity = 64 * MiB
    tier = DramTier(capacity, segment_prefix="kvtest")
    [(_, pool)] = tier.segments()
    source = memoryview(bytes(range(256)) * (8 * MiB // 256))
    r = random.Random(7)
    sizes = SIZE_MIXES[mix]
    live: OrderedDict[int, None] = OrderedDict()
    try:
        i = 0
        while True:
            size = sizes(r)
            try:
                await tier.put(_meta(i, size), source[:size])
            except TierFull:
                break
            live[i] = None
            i += 1
        assert tier.used_bytes >= 0.9 * pool and tier.used_bytes >= 0.9 * capacity
        lowest = 1.0
        for _ in range(300):
            size = sizes(r)
            while not tier.can_fit(size):
                lowest = min(lowest, tier.used_bytes / pool)
                old, _ = live.popitem(last=False)
                assert await tier.delete(_meta(old, 0).key)
            await tier.put(_meta(i, size), source[:size])
            live[i] = None
            i += 1
        assert lowest >= 0.9, f"only {lowest:.1%} of the pool held payload under churn"
        # Every block still reads back its own bytes.
        for j in list(live)[-20:]:
            view = await tier.get(_meta(j, 0).key)
            assert bytes(view) == bytes(source[: len(view)])
            view.release()
    finally:
        await tier.close()
