"""The engine's durability rules over a real disk tier: a persistent tier is announced
holding a block only once it holds the block's whole prefix; the recovery point writes
back, under every policy, what the policy's own write-back left in DRAM."""

from __future__ import annotations

import pytest

from kvstore import policies
from kvstore.engine.core import Engine, tier_specs
from kvstore.events import RecordingSink
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.memory import MemoryTier
from kvstore.types import BlockKey, Medium
from tests.engine.test_engine import Clock, KiB, engine_over, new_blocks


def _dram_and_disk(tmp_path, policy: str = "lru", *, demotions: bool = True,
                   **engine_options) -> tuple[Engine, Clock]:
    """An engine over a 1 MiB DRAM tier and a 1 MiB disk tier under ``policy`` (with
    ``demotions`` False, one that never asks for a write-back), on a clock the test
    moves, with a recovery point 2 s after a store."""
    clock = Clock()
    tiers = [MemoryTier(1 << 20, name="dram", medium=Medium.CPU),
             DiskTier(tmp_path, 1 << 20, name="disk")]
    pol = policies.create(policy, tier_specs(tiers))
    if not demotions:
        pol.demote_to = lambda key, tier, now: None  # type: ignore[method-assign]
    eng = Engine(tiers, pol, RecordingSink(), clock=clock, max_write_delay_s=2.0,
                 **engine_options)
    return eng, clock


def _disk_order(sink: RecordingSink) -> list[BlockKey]:
    return [m.key for kind, metas, medium in sink.calls if kind == "stored"
            and medium == Medium.DISK for m in metas]  # type: ignore[union-attr]


async def test_a_block_spilled_to_disk_is_announced_after_its_whole_prefix(tmp_path):
    """DRAM is full of the chain's head (protected: the put extends it), so the tail
    spills to disk. The head is copied to disk first, so what the disk announces is
    reachable after a restart; before, the tail alone went to disk and a restart
    dropped it as an orphan after it had been reported durable."""
    fast = MemoryTier(16 * KiB, name="dram", medium=Medium.CPU)
    eng, sink = engine_over(fast, DiskTier(tmp_path, 1 << 20), write_back=False)
    await eng.start()
    chain = new_blocks(8)
    assert await eng.put("ns", chain[:4]) == (4, 0)  # DRAM full, nothing on disk yet
    assert await eng.put("ns", chain[4:]) == (4, 0)  # spills to disk
    announced = _disk_order(sink)
    assert {k.block_hash for k in announced} >= {b.block_hash for b in chain[4:]}
    seen: set[bytes] = set()
    parent_of = {b.block_hash: b.parent_hash for b in chain}
    for key in announced:  # each parent is on disk (announced) before its child
        parent = parent_of[key.block_hash]
        assert parent is None or parent in seen, "a child reached disk before its parent"
        seen.add(key.block_hash)
    await eng.close()

    again, _ = engine_over(DiskTier(tmp_path, 1 << 20))
    await again.start()
    assert again.stats.orphans_dropped == 0
    hashes = [b.block_hash for b in chain]
    assert again.lookup("ns", hashes)[:8] == [Medium.DISK] * 8
    await again.close()


async def test_a_block_whose_prefix_is_stored_nowhere_stays_off_disk(tmp_path):
    eng, sink = engine_over(DiskTier(tmp_path, 1 << 20))
    await eng.start()
    chain = new_blocks(3)
    assert await eng.put("ns", chain[1:]) == (0, 0)  # its parent is nowhere
    assert _disk_order(sink) == []
    assert await eng.put("ns", chain) == (3, 0)
    await eng.close()


@pytest.mark.parametrize("name", policies.available())
async def test_the_recovery_point_writes_back_under_every_policy(tmp_path, name):
    """Even with a policy that never asks for a write-back (its ``demote_to`` says no),
    every block stored reaches disk at its recovery point, not before."""
    eng, clock = _dram_and_disk(tmp_path, name, demotions=False)
    await eng.start()
    blocks = new_blocks(6, seed=4)
    stored = 0
    for _ in range(3):  # an admission filter stores a block once it was asked for again
        eng.lookup("ns", [b.block_hash for b in blocks])
        stored += (await eng.put("ns", blocks))[0]
    assert stored > 0
    for dt, on_disk in ((0.0, 0), (1.9, 0), (0.2, stored)):
        clock.t += dt
        await eng.sweep()
        await eng.mover.drain()
        assert eng.index.tier_blocks["disk"] == on_disk, (name, clock.t)
    await eng.close()


async def test_a_dropped_block_is_not_written_back(tmp_path):
    """What the policy dropped before its recovery point (judged worthless) costs no
    disk write."""
    eng, clock = _dram_and_disk(tmp_path, write_back=False)
    await eng.start()
    chain = new_blocks(4, seed=5)
    await eng.put("ns", chain)
    await eng.delete("ns", [chain[3].block_hash])
    clock.t += 2.5
    await eng.sweep()
    await eng.mover.drain()
    assert eng.index.tier_blocks["disk"] == 3
    await eng.close()


async def test_a_chain_whose_head_was_deleted_is_not_copied_again_and_again(tmp_path,
                                                                            monkeypatch):
    """A chain waits in DRAM for its write-back and its head is deleted: no block of it
    can be made durable (a lookup can no longer reach it). Each block's copy used to
    retry its whole prefix, which retried its own (2^(n-2) copy calls for n blocks);
    now the copies see the prefix gone and stop, a few calls per block."""
    eng, clock = _dram_and_disk(tmp_path, write_back=False)
    await eng.start()
    n = 16
    chain = new_blocks(n, size=256, seed=7)
    await eng.put("ns", chain)
    await eng.delete("ns", [chain[0].block_hash])
    pl = eng.placement
    calls = 0
    copy_once = pl._copy_once

    async def counted(*args, **kw):
        nonlocal calls
        calls += 1
        return await copy_once(*args, **kw)

    monkeypatch.setattr(pl, "_copy_once", counted)
    clock.t += 2.5
    await eng.sweep()  # the recovery point queues every block left in DRAM
    await eng.mover.drain()
    assert await eng.drain(5.0) == 0  # none of it is reachable: none is left to write
    assert eng.index.tier_blocks["disk"] == 0
    assert calls <= 2 * n, calls
    await eng.close()
