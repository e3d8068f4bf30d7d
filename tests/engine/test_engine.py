"""The engine over real tiers: placement, write-back, demotion, pins, leases,
reservations, deferred frees, hints, recovery, and the events of each change."""

from __future__ import annotations

import pytest
from kvstore.policies import Hint, Move, TierSpec
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.errors import LeaseExpired, TierFull, UnknownReservation
from kvstore.events import RecordingSink
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.dram import DramTier
from kvstore.tiers.memory import MemoryTier
from kvstore.types import BlockKey, Medium
from tests.blocks import make_chain

KiB = 1024


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def new_blocks(n: int, size: int = 4 * KiB, seed: int = 0) -> list[NewBlock]:
    return [NewBlock(b.block_hash, b.parent_hash, tuple(b.token_ids), b.payload)
            for b in make_chain(n, size, seed=seed)]


def engine_over(*tiers, clock=None, **kw) -> tuple[Engine, RecordingSink]:
    sink = RecordingSink()
    policy = LRUPolicy([TierSpec(t.name, t.capacity_bytes) for t in tiers])
    return Engine(list(tiers), policy, sink, clock=clock or Clock(), **kw), sink


def media_of(sink: RecordingSink, kind: str) -> list[Medium]:
    return [medium for k, _, medium in sink.calls if k == kind]


async def test_write_back_copies_to_the_next_tier_and_announces_it():
    fast = MemoryTier(64 * KiB, name="fast", medium=Medium.CPU)
    slow = MemoryTier(64 * KiB, name="slow", medium=Medium.DISK)
    eng, sink = engine_over(fast, slow)
    await eng.start()
    blocks = new_blocks(4)
    assert await eng.put("ns", blocks) == (4, 0)
    await eng.mover.drain()
    assert all(e.tiers == ["fast", "slow"] for e in eng.index.entries())
    assert media_of(sink, "stored") == [Medium.CPU] * 4 + [Medium.DISK] * 4
    assert eng.lookup("ns", [b.block_hash for b in blocks]) == [Medium.CPU] * 4
    await eng.close()


async def test_eviction_demotes_and_emits_removed_for_the_fast_medium():
    fast = MemoryTier(12 * KiB, name="fast", medium=Medium.CPU)
    slow = MemoryTier(64 * KiB, name="slow", medium=Medium.DISK)
    eng, sink = engine_over(fast, slow, write_back=False)
    await eng.start()
    first, second = new_blocks(3), new_blocks(2, seed=1)
    await eng.put("ns", first)
    # A put never evicts its own blocks: a 3-block chain plus 2 more in one put would
    # keep the head; a second request's blocks push the first one's tail down.
    await eng.put("ns", second)
    assert fast.used_bytes == 12 * KiB and slow.used_bytes == 8 * KiB
    assert media_of(sink, "removed") == [Medium.CPU, Medium.CPU]
    # Two went down, not away, and a chain loses its tail before its head.
    assert eng.lookup("ns", [b.block_hash for b in first]) == [
        Medium.CPU, Medium.DISK, Medium.DISK]
    got = await eng.get("ns", [b.block_hash for b in first + second])
    assert [g[1] for g in got if g] == [bytes(b.payload) for b in first + second]
    # The slower tier announced the chain head first (demotions go parents first).
    stored_disk = [m for k, metas, medium in sink.calls if k == "stored" and
                   medium == Medium.DISK for m in metas]
    assert [m.key.block_hash for m in stored_disk] == [b.block_hash for b in first[1:]]
    await eng.close()


async def test_a_put_keeps_its_chain_head_when_the_tier_is_too_small():
    fast = MemoryTier(12 * KiB, name="fast", medium=Medium.CPU)
    eng, _ = engine_over(fast, write_back=False)
    blocks = new_blocks(5)
    assert await eng.put("ns", blocks) == (3, 0)
    assert eng.stats.puts_cut == 1
    assert eng.lookup("ns", [b.block_hash for b in blocks]) == [Medium.CPU] * 3


async def test_parent_links_in_a_cycle_are_evicted_like_any_other_blocks():
    """A client that stores X under Y and Y under X (bad input: vLLM's hashes chain, so
    its cannot) does not take the server down: the first eviction that reached the
    pair walked the cycle until the process ran out of memory. Both go under pressure
    as other blocks do, and the engine keeps serving."""
    fast = MemoryTier(16 * KiB, name="fast", medium=Medium.CPU)
    eng, _ = engine_over(fast, write_back=False)
    x, y = b"x" * 32, b"y" * 32
    assert await eng.put("ns", [NewBlock(x, y, (1,), b"a" * 4 * KiB)]) == (1, 0)
    assert await eng.put("ns", [NewBlock(y, x, (2,), b"b" * 4 * KiB)]) == (1, 0)
    for seed in range(3):  # 12 blocks through a tier of 4
        chain = new_blocks(4, seed=10 + seed)
        assert await eng.put("ns", chain) == (4, 0)
        assert eng.lookup("ns", [b.block_hash for b in chain]) == [Medium.CPU] * 4
    assert eng.index.get_hash("ns", x) is None and eng.index.get_hash("ns", y) is None


async def test_capacity_is_never_exceeded_and_pinned_blocks_stay():
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng, _ = engine_over(dram, write_back=False, max_pinned_fraction=1.0)
    plane = SlotPlane(eng, dram)
    await eng.start()
    blocks = new_blocks(32)  # 4 KiB each: 16 fill the tier
    await eng.put("ns", blocks[:16])
    lease, found = await plane.acquire("ns", [b.block_hash for b in blocks[:16]])
    assert all(f is not None and f[0] is not None for f in found)
    with pytest.raises(TierFull, match="pinned or in flight"):
        await eng.put("ns", blocks[16:17])
    assert dram.used_bytes == dram.capacity_bytes
    await plane.release(lease.lease_id)
    others = new_blocks(16, seed=9)  # another chain: LRU makes room now
    await eng.put("ns", others)
    assert dram.used_bytes == 64 * KiB
    assert eng.lookup("ns", [b.block_hash for b in others]) == [Medium.CPU] * 16
    await eng.close()


async def test_reservations_expire_and_free_their_slots():
    clock = Clock()
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng, _ = engine_over(dram, clock=clock, lease_seconds=5)
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(2)
    slots = await plane.reserve("ns", [(b.block_hash, len(b.payload)) for b in blocks])
    assert dram.used_bytes == 8 * KiB
    clock.t += 10
    with pytest.raises(UnknownReservation, match="expired"):
        await plane.commit("ns", [(slots[0], blocks[0])])
    await eng.sweep()  # expired: quarantined first (a stalled writer may still write)
    assert dram.used_bytes == 8 * KiB
    clock.t += 10
    await eng.sweep()
    assert dram.used_bytes == 0
    with pytest.raises(UnknownReservation, match="never reserved"):
        await plane.commit("ns", [(slots[1], blocks[1])])
    await eng.close()


async def test_commit_checksums_what_the_client_wrote():
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng, sink = engine_over(dram)
    plane = SlotPlane(eng, dram)
    b = new_blocks(1)[0]
    (slot,) = await plane.reserve("ns", [(b.block_hash, len(b.payload))])
    plane.view(slot)[:] = b.payload
    assert await plane.commit("ns", [(slot, NewBlock(b.block_hash, b.parent_hash,
                                                     b.token_ids, b""))]) == 1
    import xxhash

    entry = eng.index.get(BlockKey("ns", b.block_hash))
    assert entry is not None and entry.meta.checksum == xxhash.xxh3_64_intdigest(b.payload)
    assert entry.meta.token_ids == b.token_ids
    assert media_of(sink, "stored") == [Medium.CPU]
    await eng.close()


async def test_expired_read_lease_is_refused_at_release():
    clock = Clock()
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng, _ = engine_over(dram, clock=clock, lease_seconds=1)
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(2)
    await eng.put("ns", blocks)
    lease, _ = await plane.acquire("ns", [blocks[0].block_hash])
    clock.t += 2
    await eng.sweep()  # unpins it
    assert BlockKey("ns", blocks[0].block_hash) not in eng.leases.pins
    with pytest.raises(LeaseExpired, match="discard"):
        await plane.release(lease.lease_id)
    await eng.close()


async def test_delete_of_a_leased_block_defers_freeing_its_bytes():
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng, sink = engine_over(dram)
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(1)
    await eng.put("ns", blocks)
    lease, found = await plane.acquire("ns", [blocks[0].block_hash])
    slot = found[0][0]
    assert await eng.delete("ns", [blocks[0].block_hash]) == 1
    assert eng.lookup("ns", [blocks[0].block_hash]) == []  # gone for everyone else
    assert media_of(sink, "removed") == [Medium.CPU]
    await eng.sweep()
    assert bytes(plane.view(slot)) == bytes(blocks[0].payload)  # the reader's bytes stay
    await plane.release(lease.lease_id)
    await eng.sweep()
    assert dram.used_bytes == 0
    await eng.close()


class MoveOnHint(LRUPolicy):
    """Offloads a session's blocks to the slow tier at turn end."""

    def on_hint(self, hint, keys, now):
        return [Move(k, t, "slow") for k, t in keys if hint.event == "turn_end" and t == "fast"]


async def test_hint_moves_run_on_the_mover():
    fast = MemoryTier(64 * KiB, name="fast", medium=Medium.CPU)
    slow = MemoryTier(64 * KiB, name="slow", medium=Medium.DISK)
    sink = RecordingSink()
    eng = Engine([fast, slow], MoveOnHint([TierSpec("fast", fast.capacity_bytes),
                                           TierSpec("slow", slow.capacity_bytes)]),
                 sink, write_back=False)
    await eng.start()
    blocks = new_blocks(3)
    await eng.put("ns", blocks, session_id="s1")
    await eng.put("ns", new_blocks(1, seed=9), session_id="s2")
    assert eng.hint(Hint("s1", "turn_end"), "ns") == 3
    await eng.mover.drain()
    assert eng.lookup("ns", [b.block_hash for b in blocks]) == [Medium.DISK] * 3
    assert fast.used_bytes == 4 * KiB  # s2's block stayed
    await eng.close()


async def test_restart_recovers_disk_blocks_and_announces_parents_first(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20)
    eng, _ = engine_over(disk)
    await eng.start()
    blocks = new_blocks(6)
    await eng.put("ns", blocks)
    await eng.close()

    eng2, sink = engine_over(DiskTier(tmp_path, 1 << 20))
    assert await eng2.start() == 6
    assert eng2.lookup("ns", [b.block_hash for b in blocks]) == [Medium.DISK] * 6
    stored = [k for kind, keys, _ in sink.calls if kind == "stored" for k in keys]
    order = [m.key.block_hash for m in stored]
    assert order == [b.block_hash for b in blocks]  # chain order, whatever the scan order
    await eng2.close()
