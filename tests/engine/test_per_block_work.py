"""What a request of many blocks costs the server per block (issue 25): one policy call
for a whole read, no read of a slot the writer checksummed, one allocator search and no
eviction pass for a reserve that fits, and the lookup's session inference taking
its short path only where it gives the long path's answer."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Any

import pytest
import xxhash
from kvstore.policies import TierSpec
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.engine.sessions import _Inferer
from kvstore.events import RecordingSink
from kvstore.tiers.dram import DramTier
from kvstore.types import BlockKey

from .conftest import PlaneFactory, written_items
from .test_engine import Clock, KiB, new_blocks


class CountingLRU(LRUPolicy):
    """LRU that counts how it is told of touches."""

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self.single: list[Hashable] = []
        self.batches: list[list[Hashable]] = []

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        self.single.append(key)
        super().on_access(key, tier, now)

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        self.batches.append(list(keys))
        for k, t in zip(keys, tiers, strict=True):
            super().on_access(k, t, now)


async def test_an_acquire_of_many_blocks_tells_the_policy_once(
        committed_plane: PlaneFactory) -> None:
    c = await committed_plane(64 * KiB, 12, size=1 * KiB, seed=5, policy=CountingLRU,
                              checksums=True)
    eng, plane, blocks = c.eng, c.plane, c.blocks
    policy = c.policy
    assert isinstance(policy, CountingLRU)
    policy.single.clear()
    policy.batches.clear()
    missing = b"\x01" * 32
    lease, found = await plane.acquire("ns", [b.block_hash for b in blocks] + [missing])
    assert found[-1] is None and all(f is not None and f[0] is not None for f in found[:-1])
    keys = [BlockKey("ns", b.block_hash) for b in blocks]
    assert policy.single == []  # not one call per block
    assert policy.batches == [keys]  # one, head first: the order they were read in
    assert set(lease.keys) == set(keys)
    await eng.close()


async def test_a_commit_of_many_blocks_touches_them_in_one_policy_call(
        committed_plane: PlaneFactory) -> None:
    c = await committed_plane(64 * KiB, 12, size=1 * KiB, seed=5, policy=CountingLRU,
                              checksums=True)
    policy = c.policy
    assert isinstance(policy, CountingLRU)
    assert policy.single == []  # not one call per block
    assert policy.batches == [c.keys[::-1]]  # one, tail first (as vLLM frees them)
    # and the order it made is the one per-block touches made: the tail goes first
    assert list(policy.victims(c.dram.name, (), 0.0))[:2] == c.keys[-1:-3:-1]
    await c.eng.close()


async def test_a_commit_with_the_writers_checksums_never_reads_the_slots(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng = Engine([dram], LRUPolicy([TierSpec(dram.name, dram.capacity_bytes)]),
                 RecordingSink(), clock=Clock())
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(8, size=1 * KiB, seed=6)
    slots = await plane.reserve("ns", [(b.block_hash, len(b.payload)) for b in blocks])
    items = written_items(plane, slots, blocks)
    views = []
    real_view = dram.view
    monkeypatch.setattr(dram, "view", lambda slot: views.append(slot) or real_view(slot))
    sums = [xxhash.xxh3_64_intdigest(b.payload) for b in blocks]
    assert await plane.commit("ns", items, checksums=sums) == 8
    assert views == []  # recorded as sent: no view of any slot, let alone a hash
    monkeypatch.undo()
    got = await eng.get("ns", [b.block_hash for b in blocks])
    assert [g[1] if g else None for g in got] == [b.payload for b in blocks]
    assert [g[0].size if g else 0 for g in got] == [1 * KiB] * 8
    await eng.close()


async def test_a_reserve_that_fits_searches_once_and_makes_no_room(
        monkeypatch: pytest.MonkeyPatch, committed_plane: PlaneFactory) -> None:
    c = await committed_plane(96 * KiB, 1, size=1 * KiB, seed=7)
    calls = {"room": 0, "search": 0}
    real_room = c.eng.placement.make_room

    async def make_room(*args: Any, **kwargs: Any) -> None:
        calls["room"] += 1
        await real_room(*args, **kwargs)

    monkeypatch.setattr(c.eng.placement, "make_room", make_room)
    alloc = c.dram._alloc
    for name in ("alloc", "can_alloc", "alloc_run"):  # every search of the free ranges
        real = getattr(alloc, name)
        monkeypatch.setattr(alloc, name, lambda size, real=real: (
            calls.__setitem__("search", calls["search"] + 1), real(size))[1])
    per_call = []
    for n, seed in ((8, 8), (64, 9)):
        fresh = new_blocks(n, size=1 * KiB, seed=seed)
        calls.update(room=0, search=0)
        slots = await c.plane.reserve("ns", [(b.block_hash, len(b.payload)) for b in fresh])
        assert all(s is not None for s in slots)
        offsets = [s.offset for s in slots if s is not None]
        assert offsets == list(range(offsets[0], offsets[0] + n * KiB, KiB))  # one run
        per_call.append((n, dict(calls)))
        await c.plane.commit("ns", written_items(c.plane, slots, fresh))
    # not two searches and an eviction pass per block: one search for them all, no pass
    assert per_call == [(8, {"room": 0, "search": 1}), (64, {"room": 0, "search": 1})]
    # A tier with no free range left still makes room (the policy's victims go).
    assert c.dram.used_bytes == 73 * KiB
    big = new_blocks(1, size=40 * KiB, seed=10)[0]
    calls.update(room=0, search=0)
    (slot,) = await c.plane.reserve("ns", [(big.block_hash, len(big.payload))])
    assert slot is not None and calls["room"] == 1
    assert c.dram.used_bytes <= 96 * KiB
    await c.eng.close()


def test_session_inference_short_path_gives_the_long_paths_answers() -> None:
    """Chains that repeat, extend, branch off a shared prefix and outlive a generation:
    ``session_for`` (short path where the chain is known whole) and ``_walk`` (always
    the long path) give the same sessions and remember the same owners."""
    rng = random.Random(3)
    fast, slow = _Inferer(limit=300), _Inferer(limit=300)
    chains: list[list[bytes]] = []
    repeats = rollovers = 0
    for _ in range(600):
        roll = rng.random()
        if chains and roll < 0.5:
            chain = rng.choice(chains)  # a repeat
        elif chains and roll < 0.8:  # an extension, or a branch off a prefix of one
            base = rng.choice(chains)
            chain = base[:rng.randint(1, len(base))] + [rng.randbytes(8)
                                                         for _ in range(rng.randint(1, 3))]
        else:
            chain = [rng.randbytes(8) for _ in range(rng.randint(1, 6))]
        chains.append(chain)
        if all(h in fast._owner for h in chain):
            repeats += 1
        old = fast._old_owner
        assert fast.session_for(chain) == slow._walk(chain)
        rollovers += fast._old_owner is not old
        assert fast._owner == slow._owner and fast._child == slow._child
        assert fast._old_owner == slow._old_owner and fast._next == slow._next
    assert repeats > 100 and rollovers >= 2  # the short path was taken, many times
