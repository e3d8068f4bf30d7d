"""Integrity of the engine and the shared-memory plane under races and misuse:
a slot is never reused while a lease or reservation can still touch it, reads are
verified, and bounds hold (issue: integrity under load)."""

from __future__ import annotations

import asyncio
import math

import pytest
from kvstore.policies import TierSpec
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.errors import InvalidArgument, PermissionDenied, UnknownReservation
from kvstore.events import RecordingSink
from kvstore.tiers.dram import DramTier
from kvstore.tiers.memory import MemoryTier
from kvstore.types import BlockKey, BlockMeta, Medium
from tests.engine.test_engine import Clock, KiB, new_blocks


class GatedTier(MemoryTier):
    """A slow tier: every put waits until the test opens the gate."""

    def __init__(self, capacity: int, name: str = "slow") -> None:
        super().__init__(capacity, name=name, medium=Medium.DISK)
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self.putting: list[BlockKey] = []

    async def put(self, meta: BlockMeta, payload: bytes | memoryview) -> None:
        self.putting.append(meta.key)
        self.waiting.set()
        await self.gate.wait()
        await super().put(meta, payload)


def _engine(*tiers, clock=None, **kw):
    policy = LRUPolicy([TierSpec(t.name, t.capacity_bytes) for t in tiers])
    return Engine(list(tiers), policy, RecordingSink(), clock=clock or Clock(), **kw)


async def test_a_block_leased_while_its_demotion_runs_keeps_its_slot():
    """The wrong-bytes race: a reader acquires a victim while its demotion copy is in
    flight; the eviction must not free (and a new put reuse) the leased slot."""
    dram = DramTier(16 * KiB, segment_prefix="kvtest")
    slow = GatedTier(64 * KiB)
    eng = _engine(dram, slow, write_back=False)
    await eng.start()
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(4)
    await eng.put("ns", blocks)  # dram full
    put_e = asyncio.ensure_future(eng.put("ns", new_blocks(1, seed=5)))  # another chain
    await slow.waiting.wait()  # the victim's demotion copy is in flight
    (victim,) = [b for b in blocks if BlockKey("ns", b.block_hash) == slow.putting[0]]
    lease, found = await plane.acquire("ns", [victim.block_hash])
    slot, _meta = found[0]
    assert slot is not None
    slow.gate.set()
    await put_e
    view = dram.view(slot)
    assert bytes(view) == bytes(victim.payload), "the leased slot was handed to another block"
    await plane.release(lease.lease_id)
    await eng.sweep()
    assert BlockKey("ns", victim.block_hash) not in {
        k for k in dram._stored}, "the deferred free never ran"
    await eng.close()


async def test_an_expired_reservation_is_quarantined_before_its_slot_is_reused():
    clock = Clock()
    dram = DramTier(8 * KiB, segment_prefix="kvtest")
    eng = _engine(dram, clock=clock, lease_seconds=5.0)
    await eng.start()
    plane = SlotPlane(eng, dram)
    a, b = new_blocks(2)
    (slot_a,) = await plane.reserve("ns", [(a.block_hash, len(a.payload))])
    clock.t += 6.0
    await eng.sweep()  # expires the reservation
    (slot_b,) = await plane.reserve("ns", [(b.block_hash, len(b.payload))])
    assert slot_a is not None and slot_b is not None
    assert slot_b.offset != slot_a.offset, "a stalled writer could still write slot_a"
    clock.t += 3 * 5.0
    await eng.sweep()  # past the quarantine: the space comes back
    assert dram.used_bytes == len(b.payload)
    await eng.close()


async def test_reservations_belong_to_the_client_that_took_them():
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng = _engine(dram)
    await eng.start()
    plane = SlotPlane(eng, dram)
    (a,) = new_blocks(1)
    (slot,) = await plane.reserve("ns", [(a.block_hash, len(a.payload))], owner="ipv4:1")
    assert slot is not None
    with pytest.raises(PermissionDenied):
        plane.abort([slot.slot_id], owner="ipv4:2")
    with pytest.raises(UnknownReservation):
        plane.abort([slot.slot_id + 1], owner="ipv4:1")
    plane.abort([slot.slot_id], owner="ipv4:1")
    assert dram.used_bytes == 0
    await eng.close()


@pytest.mark.parametrize("seconds", [math.inf, math.nan, 1e300, -1.0])
async def test_read_leases_are_bounded(seconds):
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng = _engine(dram)
    await eng.start()
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(2)
    await eng.put("ns", blocks)
    with pytest.raises(InvalidArgument, match="lease_seconds"):
        await plane.acquire("ns", [b.block_hash for b in blocks], seconds)
    assert not eng.leases.pins
    await eng.close()


async def test_leases_pin_at_most_a_share_of_shared_memory():
    """Readers cannot pin the whole tier: past the share, blocks are read over gRPC."""
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng = _engine(dram, max_pinned_fraction=0.5)
    await eng.start()
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(12)
    await eng.put("ns", blocks)
    _lease, found = await plane.acquire("ns", [b.block_hash for b in blocks])
    in_shm = [f for f in found if f is not None and f[0] is not None]
    overflow = [f for f in found if f is not None and f[0] is None]
    assert len(in_shm) == 8 and len(overflow) == 4
    await eng.put("ns", new_blocks(4, seed=7))  # puts still find room
    await eng.close()


async def test_dram_reads_are_verified_and_a_corrupt_copy_is_dropped():
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng = _engine(dram)
    await eng.start()
    blocks = new_blocks(3)
    await eng.put("ns", blocks)
    slot = dram.locate(BlockKey("ns", blocks[1].block_hash))
    dram.view(slot)[0] ^= 0xFF  # overwritten through the mapping
    got = await eng.get("ns", [b.block_hash for b in blocks])
    assert got[0] is not None and got[2] is not None
    assert got[1] is None
    assert eng.stats.corrupt_reads == 1
    assert eng.lookup("ns", [b.block_hash for b in blocks]) == [Medium.CPU]
    await eng.close()


async def test_write_back_drops_a_corrupt_source_instead_of_serving_it():
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    disk = MemoryTier(64 * KiB, name="disk", medium=Medium.DISK)
    eng = _engine(dram, disk)  # mover not started: write-backs wait in the queue
    blocks = new_blocks(2)
    await eng.put("ns", blocks)
    dram.view(dram.locate(BlockKey("ns", blocks[1].block_hash)))[5] ^= 1
    await eng.mover.run_pending()
    assert eng.index.get(BlockKey("ns", blocks[1].block_hash)) is None
    assert [e.tiers for e in eng.index.entries()] == [["dram", "disk"]]
    assert eng.stats.corrupt_reads == 1
    await eng.close()


async def test_duplicate_and_oversized_requests_are_refused():
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng = _engine(dram, max_hashes=4, max_block_tokens=32)
    await eng.start()
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(2)
    await eng.put("ns", blocks)
    h = blocks[0].block_hash
    with pytest.raises(InvalidArgument, match="duplicate"):
        [x async for x in eng.iter_get("ns", [h, h])]
    with pytest.raises(InvalidArgument, match="duplicate"):
        await plane.acquire("ns", [h, h])
    with pytest.raises(InvalidArgument, match="at most 4"):
        eng.lookup("ns", [h] * 5)
    big = new_blocks(1, seed=3)[0]
    with pytest.raises(InvalidArgument, match="token ids"):
        await eng.put("ns", [type(big)(big.block_hash, None, tuple(range(33)), big.payload)])
    await eng.close()
