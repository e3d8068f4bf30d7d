"""Per-tenant quotas: a tenant past its limit in a tier gives up its own blocks there
(or its blocks spill / are refused), never another tenant's."""

from __future__ import annotations

import pytest
from kvstore.policies import TierSpec

from kvstore import policies
from kvstore.engine.core import Engine
from kvstore.engine.quotas import Quota, Quotas
from kvstore.events import RecordingSink
from kvstore.tiers.memory import MemoryTier
from kvstore.types import Medium

from .test_engine import Clock, new_blocks

KiB = 1024


def two_tiers(policy: str, quotas: list[Quota], **kw: object) -> Engine:
    fast = MemoryTier(64 * KiB, name="fast", medium=Medium.CPU)
    slow = MemoryTier(256 * KiB, name="slow", medium=Medium.DISK)
    specs = [TierSpec(t.name, t.capacity_bytes) for t in (fast, slow)]
    return Engine([fast, slow], policies.create(policy, specs), RecordingSink(), clock=Clock(),
                  quotas=quotas, **kw)  # type: ignore[arg-type]


def held(eng: Engine, prefix: str, tier: str) -> int:
    return sum(e.meta.size for e in eng.index.entries()
               if e.key.namespace.startswith(prefix) and tier in e.tiers)


@pytest.mark.parametrize("policy", ["lru", "workload"])
@pytest.mark.parametrize("write_back", [False, True])
async def test_a_tenant_over_its_quota_evicts_only_its_own_blocks(
        policy: str, write_back: bool) -> None:
    quota = Quota("tenant-a/", {"fast": 16 * KiB, "slow": 48 * KiB})
    eng = two_tiers(policy, [quota], write_back=write_back)
    await eng.start()
    other = new_blocks(10, seed=100)  # 40 KiB of tenant b, no quota
    assert await eng.put("tenant-b/m", other) == (10, 0)
    await eng.mover.drain()
    b_hashes = [b.block_hash for b in other]
    for i in range(40):  # 40 requests of 4 blocks (640 KiB) from tenant a
        blocks = new_blocks(4, seed=i)
        stored, _ = await eng.put("tenant-a/m", blocks, session_id=f"s{i}")
        assert stored >= 1
        await eng.mover.drain()
        assert held(eng, "tenant-a/", "fast") <= 16 * KiB
        assert held(eng, "tenant-a/", "slow") <= 48 * KiB
        # the other tenant keeps every block, in the tier it was in
        assert eng.lookup("tenant-b/m", b_hashes) == [Medium.CPU] * 10
    assert eng.quotas.used(quota, "fast") == held(eng, "tenant-a/", "fast") > 0
    assert eng.quotas.used(quota, "slow") == held(eng, "tenant-a/", "slow") > 0
    usage = {u.tier: u for u in eng.quotas.usage()}
    assert usage["fast"].limit_bytes == 16 * KiB and usage["fast"].evictions > 0
    assert usage["slow"].used_bytes <= 48 * KiB
    # the latest request of tenant a is served (its own older blocks made room)
    assert eng.lookup("tenant-a/m", [b.block_hash for b in new_blocks(4, seed=39)])[0] in (
        Medium.CPU, Medium.DISK)
    await eng.close()


async def test_a_put_larger_than_the_quota_spills_then_is_cut() -> None:
    eng = two_tiers("lru", [Quota("a/", {"fast": 8 * KiB, "slow": 8 * KiB})],
                    write_back=False)
    await eng.start()
    blocks = new_blocks(6)  # 24 KiB: 2 blocks fit in each tier's quota
    assert await eng.put("a/x", blocks) == (4, 0)
    assert eng.lookup("a/x", [b.block_hash for b in blocks]) == (
        [Medium.CPU] * 2 + [Medium.DISK] * 2)
    assert eng.stats.puts_cut == 1
    refused = {u.tier: u.refused for u in eng.quotas.usage()}
    assert refused["fast"] >= 1 and refused["slow"] >= 1
    await eng.close()


async def test_longest_prefix_wins_and_no_quota_counts_nothing() -> None:
    qs = Quotas([Quota("t/", {"fast": 10}), Quota("t/big/", {"fast": 100})])
    assert qs.quota_of("t/big/x").prefix == "t/big/"  # type: ignore[union-attr]
    assert qs.quota_of("t/x").prefix == "t/"  # type: ignore[union-attr]
    assert qs.quota_of("u/x") is None
    qs.charge("t/x", "fast", 6)
    assert qs.excess("t/x", "fast", 5) == 1 and qs.excess("t/big/y", "fast", 5) == 0
    assert qs.excess("u/x", "fast", 10**9) == 0 and qs.excess("t/x", "slow", 10**9) == 0
    eng = two_tiers("lru", [])
    assert not eng.quotas and eng.index.on_bytes is None
    with pytest.raises(ValueError, match="unknown tiers"):
        two_tiers("lru", [Quota("a/", {"dram": 1})])
    with pytest.raises(ValueError, match="unique"):
        Quotas([Quota("a/", {}), Quota("a/", {})])


async def test_quotas_show_in_stats_and_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
    from kvstore.metrics import EngineCollector
    from kvstore.server.servicer import KVStoreServicer

    eng = two_tiers("lru", [Quota("a/", {"fast": 8 * KiB})], write_back=False)
    await eng.start()
    await eng.put("a/x", new_blocks(3))  # 2 fit the quota in fast, 1 spills to slow
    stats = await KVStoreServicer(eng).Stats(pb.StatsRequest(), None)
    (q,) = stats.quotas
    assert (q.namespace_prefix, q.tier, q.limit_bytes, q.used_bytes) == (
        "a/", "fast", 8 * KiB, 8 * KiB)
    assert q.refused >= 1
    registry = CollectorRegistry()
    registry.register(EngineCollector(eng))
    body = generate_latest(registry).decode()
    assert 'kvstore_quota_limit_bytes{prefix="a/",tier="fast"} 8192.0' in body
    assert 'kvstore_quota_used_bytes{prefix="a/",tier="fast"} 8192.0' in body
    assert 'kvstore_quota_refused_total{prefix="a/",tier="fast"}' in body
    await eng.close()


async def test_shared_memory_reservations_respect_the_quota() -> None:
    from kvstore.policies.lru import LRUPolicy

    from kvstore.engine.blocks import NewBlock
    from kvstore.engine.dataplane import SlotPlane
    from kvstore.tiers.dram import DramTier

    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng = Engine([dram], LRUPolicy([TierSpec(dram.name, dram.capacity_bytes)]),
                 RecordingSink(), clock=Clock(), quotas=[Quota("a/", {dram.name: 8 * KiB})])
    plane = SlotPlane(eng, dram)

    async def write(ns: str, blocks: list[NewBlock]) -> int:
        slots = await plane.reserve(ns, [(b.block_hash, len(b.payload)) for b in blocks])
        items = []
        for slot, b in zip(slots, blocks, strict=True):
            if slot is not None:
                plane.view(slot)[:] = b.payload
                items.append((slot, NewBlock(b.block_hash, b.parent_hash, b.token_ids, b"")))
        return await plane.commit(ns, items)

    other = new_blocks(8, seed=50)
    assert await write("b/x", other) == 8
    for i in range(6):  # one block per request: each evicts tenant a's oldest
        assert await write("a/x", new_blocks(1, seed=i)) == 1
        assert held(eng, "a/", dram.name) <= 8 * KiB
    # one reservation of 4 blocks: what it reserved counts before it is committed, so
    # the chain is cut where the quota ends
    chain = new_blocks(4, seed=100)
    assert await write("a/y", chain) == 2
    assert held(eng, "a/", dram.name) <= 8 * KiB
    assert eng.lookup("a/y", [b.block_hash for b in chain]) == [Medium.CPU] * 2
    assert eng.lookup("b/x", [b.block_hash for b in other]) == [Medium.CPU] * 8
    await eng.close()


async def test_a_commit_staged_for_a_tier_at_its_quota_stops_there() -> None:
    from kvstore.policies import Plan, RequestInfo
    from kvstore.policies.lru import LRUPolicy

    from kvstore.engine.blocks import NewBlock
    from kvstore.engine.dataplane import SlotPlane
    from kvstore.tiers.dram import DramTier

    class ToSlow(LRUPolicy):  # every new block belongs in the slower tier
        def on_request(self, req: RequestInfo, now: float) -> Plan:
            return Plan(admit={k: "slow" for k, t in zip(req.keys, req.hit_tiers,
                                                         strict=True) if t is None})

    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    slow = MemoryTier(256 * KiB, name="slow", medium=Medium.DISK)
    specs = [TierSpec(t.name, t.capacity_bytes) for t in (dram, slow)]
    eng = Engine([dram, slow], ToSlow(specs), RecordingSink(), clock=Clock(), write_back=False,
                 quotas=[Quota("a/", {"slow": 8 * KiB})])
    await eng.start()
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(4)
    assert eng.lookup("a/x", [b.block_hash for b in blocks], request_id="r1") == []
    slots = await plane.reserve("a/x", [(b.block_hash, len(b.payload)) for b in blocks],
                                request_id="r1")
    assert all(s is not None for s in slots)  # staged in shared memory, bound for slow
    for slot, b in zip(slots, blocks, strict=True):
        plane.view(slot)[:] = b.payload  # type: ignore[arg-type]
    items = [(s, NewBlock(b.block_hash, b.parent_hash, b.token_ids, b""))
             for s, b in zip(slots, blocks, strict=True)]
    # the first two fit the quota; protected as the request's own, nothing else can go
    assert await plane.commit("a/x", items, request_id="r1") == 2  # type: ignore[arg-type]
    assert eng.lookup("a/x", [b.block_hash for b in blocks]) == [Medium.DISK] * 2
    assert dram.used_bytes == 0  # every staging slot freed, committed or not
    assert not eng.leases.reserved
    await eng.close()
