"""Retention (cache_ttl_s): a retained prefix outlives pressure that evicts unretained
blocks of its tier, goes once its TTL passes, and a tenant past its retention quota
cannot protect more. Over every policy: the engine applies the protection, not the policy."""

from __future__ import annotations

import pytest
from kvstore.policies import Hint, TierSpec

from kvstore import policies
from kvstore.engine.core import Engine, NewBlock
from kvstore.engine.quotas import Quota
from kvstore.engine.retention import RetentionLimits
from kvstore.errors import InvalidArgument
from kvstore.events import RecordingSink
from kvstore.tiers.memory import MemoryTier
from kvstore.types import BlockKey, Medium

from .test_engine import Clock, new_blocks

KiB = 1024
POLICIES = policies.available()


def engine(policy: str, *tiers: MemoryTier, clock: Clock | None = None,
           **kw: object) -> Engine:
    specs = [TierSpec(t.name, t.capacity_bytes) for t in tiers]
    return Engine(list(tiers), policies.create(policy, specs), RecordingSink(),
                  clock=clock or Clock(), write_back=False, **kw)  # type: ignore[arg-type]


async def put(eng: Engine, namespace: str, blocks: list[NewBlock], session_id: str = ""
              ) -> tuple[int, int]:
    """Store as a client does: a lookup first (twice: the admission filters admit what
    they saw before), then the put."""
    for _ in range(2):
        eng.lookup(namespace, [b.block_hash for b in blocks], session_id=session_id)
    return await eng.put(namespace, blocks, session_id=session_id)


def in_tier(eng: Engine, namespace: str, hashes: list[bytes], tier: str) -> int:
    return sum(1 for h in hashes if (e := eng.index.get_hash(namespace, h)) and tier in e.tiers)


@pytest.mark.parametrize("policy", POLICIES)
async def test_a_retained_prefix_outlives_pressure_then_goes_after_its_ttl(policy: str) -> None:
    clock = Clock()
    eng = engine(policy, MemoryTier(64 * KiB, name="dram", medium=Medium.CPU), clock=clock)
    await eng.start()
    prefix = new_blocks(4, seed=1)  # 16 KiB of a 64 KiB tier
    hashes = [b.block_hash for b in prefix]
    assert await put(eng, "m", prefix, "sys") == (4, 0)
    assert eng.retain("m", hashes, 300) == 4
    for i in range(30):  # 480 KiB of unretained requests through the tier
        clock.t += 1
        await put(eng, "m", new_blocks(4, seed=100 + i), f"s{i}")
        assert in_tier(eng, "m", hashes, "dram") == 4, f"request {i} evicted the retained prefix"
    assert eng.stats.evictions["dram"] >= 20  # the pressure was real
    assert eng.lookup("m", hashes) == [Medium.CPU] * 4
    assert eng.retention.returned >= 4
    clock.t += 300  # the TTL passes: the prefix is an ordinary block again
    for i in range(8):
        clock.t += 1
        fresh = new_blocks(4, seed=200 + i)
        await put(eng, "m", fresh, f"t{i}")
        # used again, as the prefix was: a frequency-aware order (ARC's T2) then ranks
        # the prefix by recency among its peers, not above every one-time block
        eng.lookup("m", [b.block_hash for b in fresh])
    assert in_tier(eng, "m", hashes, "dram") == 0
    await eng.close()


@pytest.mark.parametrize("policy", POLICIES)
async def test_a_tier_full_of_retained_blocks_still_takes_puts_by_demoting_them(
        policy: str) -> None:
    clock = Clock()
    fast = MemoryTier(32 * KiB, name="dram", medium=Medium.CPU)
    slow = MemoryTier(256 * KiB, name="disk", medium=Medium.DISK)
    eng = engine(policy, fast, slow, clock=clock,
                 retention=RetentionLimits(bytes_per_tier={"dram": 64 * KiB, "disk": 64 * KiB}))
    await eng.start()
    older, newer = new_blocks(4, seed=1), new_blocks(4, seed=2)
    await put(eng, "m", older)
    assert eng.retain("m", [b.block_hash for b in older], 100) == 4
    clock.t += 1
    await put(eng, "m", newer)
    assert eng.retain("m", [b.block_hash for b in newer], 600) == 4
    assert fast.used_bytes == 32 * KiB  # full of retained blocks
    stored, _ = await put(eng, "m", new_blocks(2, seed=3))
    assert stored == 2  # never a hard pin
    # the oldest deadline went, down a tier rather than dropped
    older_h = [b.block_hash for b in older]
    assert in_tier(eng, "m", [b.block_hash for b in newer], "dram") == 4
    assert in_tier(eng, "m", older_h, "disk") >= 2
    assert all(eng.index.get_hash("m", h) is not None for h in older_h)
    await eng.close()


async def test_a_tenant_past_its_retention_quota_cannot_protect_more() -> None:
    clock = Clock()
    eng = engine("lru", MemoryTier(64 * KiB, name="dram", medium=Medium.CPU), clock=clock,
                 quotas=[Quota("tenant-a/", {"dram": 64 * KiB})],
                 retention=RetentionLimits(bytes_per_tier={"dram": 8 * KiB}))
    await eng.start()
    first, second = new_blocks(4, seed=1), new_blocks(4, seed=2)
    await put(eng, "tenant-a/m1", first)
    await put(eng, "tenant-a/m2", second)
    assert eng.retain("tenant-a/m1", [b.block_hash for b in first], 300) == 2  # 8 KiB
    # the tenant is every namespace under its quota prefix: m2 shares the 8 KiB
    assert eng.retain("tenant-a/m2", [b.block_hash for b in second], 300) == 0
    assert eng.retention.refused == 6
    # another tenant has a quota of its own
    other = new_blocks(2, seed=3)
    await put(eng, "tenant-b/m", other)
    assert eng.retain("tenant-b/m", [b.block_hash for b in other], 300) == 2
    usage = {(u.tenant, u.tier): u.retained_bytes for u in eng.retention.usage(eng.index,
                                                                               clock())}
    assert usage == {("tenant-a/", "dram"): 8 * KiB, ("tenant-b/m", "dram"): 8 * KiB}
    for i in range(20):  # pressure: only the protected blocks survive it
        clock.t += 1
        await put(eng, "tenant-c/m", new_blocks(4, seed=100 + i))
    assert in_tier(eng, "tenant-a/m1", [b.block_hash for b in first[:2]], "dram") == 2
    assert in_tier(eng, "tenant-a/m2", [b.block_hash for b in second], "dram") == 0
    await eng.close()


async def test_a_block_retained_before_it_is_stored_is_protected_when_stored() -> None:
    clock = Clock()
    eng = engine("lru", MemoryTier(32 * KiB, name="dram", medium=Medium.CPU), clock=clock)
    await eng.start()
    blocks = new_blocks(2, seed=1)
    assert eng.retain("m", [b.block_hash for b in blocks], 60) == 0  # nothing stored yet
    await put(eng, "m", blocks)
    for i in range(10):
        clock.t += 1
        await put(eng, "m", new_blocks(2, seed=100 + i))
    assert in_tier(eng, "m", [b.block_hash for b in blocks], "dram") == 2
    await eng.close()


async def test_the_policys_own_drop_waits_for_the_deadline() -> None:
    clock = Clock()
    eng = engine("ttl", MemoryTier(64 * KiB, name="dram", medium=Medium.CPU), clock=clock)
    await eng.start()
    blocks = new_blocks(3, seed=1)
    hashes = [b.block_hash for b in blocks]
    await put(eng, "m", blocks, "s")
    assert eng.retain("m", hashes, 60) == 3
    eng.hint(Hint("s", "session_end"), "m")
    await eng.mover.drain()
    assert in_tier(eng, "m", hashes, "dram") == 3
    await eng.close()


async def test_bad_ttls_are_refused_naming_the_limit() -> None:
    eng = engine("lru", MemoryTier(32 * KiB, name="dram", medium=Medium.CPU),
                 retention=RetentionLimits(max_ttl_s=600))
    await eng.start()
    blocks = new_blocks(1)
    await put(eng, "m", blocks)
    with pytest.raises(InvalidArgument, match=r"retention\.max_ttl_s = 600"):
        eng.retain("m", [blocks[0].block_hash], 601)
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="ttl_s"):
            eng.retain("m", [blocks[0].block_hash], bad)
    assert eng.retain("m", [blocks[0].block_hash], 60) == 1
    assert eng.retain("m", [blocks[0].block_hash], 0) == 0  # 0 ends the retention
    assert not eng.retention
    await eng.close()


async def test_asks_for_unstored_blocks_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstore.engine import retention

    monkeypatch.setattr(retention, "MAX_PENDING", 2)
    clock = Clock()
    eng = engine("lru", MemoryTier(32 * KiB, name="dram", medium=Medium.CPU), clock=clock)
    await eng.start()
    blocks = new_blocks(3, seed=1)
    assert eng.retain("m", [b.block_hash for b in blocks], 60) == 0
    await put(eng, "m", blocks)
    # the first two asks were remembered and protect their blocks once stored; the third not
    assert [eng.retention.active(BlockKey("m", b.block_hash), clock()) for b in blocks] == [
        True, True, False]
    await eng.close()
