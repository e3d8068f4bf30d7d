"""What a request of many blocks costs the server per block (issue 25): one policy call
for a whole read, no read of a slot the writer checksummed, and the lookup's session
inference taking its short path only where it gives the long path's answer."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

import xxhash
from kvstore.policies import TierSpec
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.engine.sessions import _Inferer
from kvstore.events import RecordingSink
from kvstore.tiers.dram import DramTier
from kvstore.types import BlockKey

from .test_engine import Clock, KiB, new_blocks


class CountingLRU(LRUPolicy):
    """LRU that counts how it is told of reads."""

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


async def stored_plane(n: int) -> tuple[Engine, SlotPlane, CountingLRU, list[NewBlock]]:
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    policy = CountingLRU([TierSpec(dram.name, dram.capacity_bytes)])
    eng = Engine([dram], policy, RecordingSink(), clock=Clock())
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(n, size=1 * KiB, seed=5)
    slots = await plane.reserve("ns", [(b.block_hash, len(b.payload)) for b in blocks])
    items = []
    for slot, b in zip(slots, blocks, strict=True):
        assert slot is not None
        plane.view(slot)[:] = b.payload
        items.append((slot, NewBlock(b.block_hash, b.parent_hash, b.token_ids, b"")))
    sums = [xxhash.xxh3_64_intdigest(b.payload) for b in blocks]
    assert await plane.commit("ns", items, checksums=sums) == n
    return eng, plane, policy, blocks


async def test_an_acquire_of_many_blocks_tells_the_policy_once() -> None:
    eng, plane, policy, blocks = await stored_plane(12)
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


async def test_a_commit_with_the_writers_checksums_never_reads_the_slots(monkeypatch) -> None:
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng = Engine([dram], LRUPolicy([TierSpec(dram.name, dram.capacity_bytes)]),
                 RecordingSink(), clock=Clock())
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(8, size=1 * KiB, seed=6)
    slots = await plane.reserve("ns", [(b.block_hash, len(b.payload)) for b in blocks])
    items = []
    for slot, b in zip(slots, blocks, strict=True):
        assert slot is not None
        plane.view(slot)[:] = b.payload
        items.append((slot, NewBlock(b.block_hash, b.parent_hash, b.token_ids, b"")))
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
