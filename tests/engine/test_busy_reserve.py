"""A reservation in a tier whose blocks are all being copied out (write-back) waits for
the copies, briefly, instead of being refused just before room frees up."""

from __future__ import annotations

import asyncio
import time

import pytest
from kvstore.policies import TierSpec
from kvstore.policies.lru import LRUPolicy

from kvstore.engine import store as store_pipeline
from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.errors import TierFull
from kvstore.events import RecordingSink
from kvstore.tiers.dram import DramTier
from kvstore.types import BlockKey

from .test_engine import Clock, new_blocks

KiB = 1024


async def full_plane() -> tuple[Engine, SlotPlane, list[BlockKey]]:
    dram = DramTier(16 * KiB, segment_prefix="kvtest")
    eng = Engine([dram], LRUPolicy([TierSpec(dram.name, dram.capacity_bytes)]),
                 RecordingSink(), clock=Clock())
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(4, seed=3)  # 4 x 4 KiB: the tier is full
    slots = await plane.reserve("ns", [(b.block_hash, len(b.payload)) for b in blocks])
    items = []
    for slot, b in zip(slots, blocks, strict=True):
        assert slot is not None
        plane.view(slot)[:] = b.payload
        items.append((slot, NewBlock(b.block_hash, b.parent_hash, b.token_ids, b"")))
    assert await plane.commit("ns", items) == 4
    return eng, plane, [BlockKey("ns", bytes(b.block_hash)) for b in blocks]


async def test_waits_for_copies_out_then_reserves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_pipeline, "BUSY_WAIT_S", 10.0)  # a loaded machine: ample
    eng, plane, keys = await full_plane()
    for k in keys:  # every block is being copied to a slower tier (pinned meanwhile)
        eng.placement._in_flight[k] += 1

    async def copies_end() -> None:
        await asyncio.sleep(0.1)
        eng.placement._in_flight.clear()

    ending = asyncio.create_task(copies_end())
    fresh = new_blocks(1, seed=9)[0]
    started = time.monotonic()
    (slot,) = await plane.reserve("ns", [(fresh.block_hash, len(fresh.payload))])
    assert slot is not None and time.monotonic() - started >= 0.09
    await ending
    await eng.close()


async def test_pinned_without_copies_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_pipeline, "BUSY_WAIT_S", 10.0)
    eng, plane, keys = await full_plane()
    lease = eng.leases  # a reader pins every block: nothing in flight to wait for
    for k in keys:
        lease.pins[k] += 1
    fresh = new_blocks(1, seed=9)[0]
    started = time.monotonic()
    with pytest.raises(TierFull):
        await plane.reserve("ns", [(fresh.block_hash, len(fresh.payload))])
    assert time.monotonic() - started < 0.5  # not the wait (monkeypatched below)
    # copies that never end: refused once the wait is over
    monkeypatch.setattr(store_pipeline, "BUSY_WAIT_S", 0.2)
    for k in keys:
        del lease.pins[k]
        eng.placement._in_flight[k] += 1
    started = time.monotonic()
    with pytest.raises(TierFull):
        await plane.reserve("ns", [(fresh.block_hash, len(fresh.payload))])
    assert time.monotonic() - started >= 0.2
    eng.placement._in_flight.clear()
    await eng.close()
