"""A reservation in a tier whose blocks are all being copied out (write-back) waits for
the copies, briefly, instead of being refused just before room frees up."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvstore.engine import store as store_pipeline
from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.errors import TierFull
from kvstore.types import BlockKey

from .conftest import PlaneFactory
from .test_engine import new_blocks

KiB = 1024


async def full_plane(committed_plane: PlaneFactory) -> tuple[Engine, SlotPlane, list[BlockKey]]:
    c = await committed_plane(16 * KiB, 4, seed=3)  # 4 x 4 KiB: the tier is full
    return c.eng, c.plane, c.keys


async def test_waits_for_copies_out_then_reserves(monkeypatch: pytest.MonkeyPatch,
                                                  committed_plane: PlaneFactory) -> None:
    monkeypatch.setattr(store_pipeline, "BUSY_WAIT_S", 10.0)  # a loaded machine: ample
    eng, plane, keys = await full_plane(committed_plane)
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


async def test_pinned_without_copies_is_refused_at_once(monkeypatch: pytest.MonkeyPatch,
                                                        committed_plane: PlaneFactory) -> None:
    monkeypatch.setattr(store_pipeline, "BUSY_WAIT_S", 10.0)
    eng, plane, keys = await full_plane(committed_plane)
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
