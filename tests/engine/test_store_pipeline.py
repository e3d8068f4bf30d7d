"""The one store pipeline (kvstore.engine.store): the gRPC put and the shared-memory
reserve/commit are two front ends of the same operation, so the same blocks end in
the same places with the same events and write-back; ``put(spill=False)`` runs the
connector's semantics on any tiers; and the engine's lookup / hint carry what the
servicer used to decide (repeat detection, profile, hold, hint validation)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kvstore.policies import Hint, TierSpec
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.errors import InvalidArgument, TierFull
from kvstore.events import RecordingSink
from kvstore.profile.live import LiveProfile
from kvstore.tiers.base import Tier
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.dram import DramTier
from kvstore.tiers.memory import MemoryTier
from kvstore.types import BlockKey, BlockMeta, Medium
from tests.engine.test_engine import Clock, KiB, new_blocks

NS = "ns"


def _engine(*tiers: Tier) -> tuple[Engine, RecordingSink]:
    sink = RecordingSink()
    policy = LRUPolicy([TierSpec(t.name, t.capacity_bytes) for t in tiers])
    return Engine(list(tiers), policy, sink, clock=Clock()), sink


async def _put(eng: Engine, blocks: list[NewBlock], rid: str, spill: bool = True) -> int:
    return (await eng.put(NS, blocks, request_id=rid, spill=spill))[0]


async def _reserve_commit(eng: Engine, blocks: list[NewBlock], rid: str) -> int:
    """What the connector does: reserve slots, write the bytes into them, commit."""
    plane = SlotPlane.for_engine(eng)
    assert plane is not None
    slots = await plane.reserve(NS, [(b.block_hash, len(b.payload)) for b in blocks],
                                owner="me", request_id=rid)
    items = []
    for b, slot in zip(blocks, slots, strict=True):
        if slot is None:
            continue
        plane.view(slot)[:] = b.payload
        items.append((slot, NewBlock(b.block_hash, b.parent_hash, b.token_ids, b"")))
    return await plane.commit(NS, items, owner="me", request_id=rid)


def _event(call: tuple[str, tuple[Any, ...], Medium | None]) -> tuple[Any, ...]:
    kind, items, medium = call
    keys = tuple((i.key, i.parent_hash, i.token_ids, i.size, i.checksum, i.session_id,
                  i.workload) if isinstance(i, BlockMeta) else i for i in items)
    return kind, keys, medium


def _outcome(eng: Engine, sink: RecordingSink) -> tuple[Any, ...]:
    """Placement, the events one block each (a commit tells the sink of a batch in one
    call, a put of each block: the wire's runs are built from the blocks either way),
    and the counters."""
    placement = {e.key: tuple(e.tiers) for e in eng.index.entries()}
    st = eng.stats
    events = [_event((kind, (item,), medium)) for kind, items, medium in sink.calls
              for item in (items or (None,))]
    return (placement, events,
            (st.bytes_in, st.puts, dict(st.evictions), dict(st.moved_bytes)))


async def _run(front: str, tmp_path: Path) -> tuple[Any, ...]:
    """Two chains through one front end; the second makes room by evicting the first
    (demoted to disk by its write-back), and each store queues its write-back."""
    dram = DramTier(16 * KiB, segment_prefix="kvtest")
    disk = DiskTier(tmp_path / front, 1 << 20, name="disk")
    eng, sink = _engine(dram, disk)
    await eng.start()
    try:
        store = _put if front == "put" else _reserve_commit
        for rid, chain in (("a", new_blocks(4, seed=1)), ("b", new_blocks(3, seed=2))):
            hashes = [b.block_hash for b in chain]
            assert eng.lookup_request(NS, hashes, "s", "chat", request_id=rid).store == len(chain)
            assert await store(eng, chain, rid) == len(chain)
            await eng.mover.drain()  # the write-back each store queued
        return _outcome(eng, sink)
    finally:
        await eng.close()


async def test_put_and_reserve_commit_give_the_same_placement_events_and_write_back(
        tmp_path: Path) -> None:
    put = await _run("put", tmp_path)
    shm = await _run("shm", tmp_path)
    placement = put[0]
    assert sum(tiers == ("dram", "disk") for tiers in placement.values()) == 4  # room: 3 went
    assert sum(tiers == ("disk",) for tiers in placement.values()) == 3
    assert put[0] == shm[0]  # placement
    assert sorted(put[1], key=repr) == sorted(shm[1], key=repr)  # events
    assert [e for e in put[1] if e[2] is Medium.CPU] == [e for e in shm[1] if e[2] is Medium.CPU]
    assert put[2] == shm[2]  # bytes in, puts, evictions, write-back bytes moved


async def _own_blocks_fill(front: str, tmp_path: Path, spill: bool = False
                           ) -> tuple[dict[BlockKey, tuple[str, ...]], int]:
    """A chain longer than DRAM, all its blocks the request's own (none may be evicted
    for the others): each front end, one block per call as a client ends up sending
    them after halving a refused batch."""
    dram = DramTier(8 * KiB, segment_prefix="kvtest")
    disk = DiskTier(tmp_path / f"{front}{spill}", 1 << 20, name="disk")
    eng, _ = _engine(dram, disk)
    await eng.start()
    try:
        chain = new_blocks(4, seed=3)
        eng.lookup_request(NS, [b.block_hash for b in chain], "s", request_id="r")
        refused = 0
        for b in chain:
            try:
                if front == "put":
                    await _put(eng, [b], "r", spill=spill)
                else:
                    await _reserve_commit(eng, [b], "r")
            except TierFull:
                refused += 1
        return {e.key: tuple(e.tiers) for e in eng.index.entries()}, refused
    finally:
        await eng.close()


async def test_put_without_spill_runs_the_connectors_semantics(tmp_path: Path) -> None:
    shm, shm_refused = await _own_blocks_fill("shm", tmp_path)
    put, put_refused = await _own_blocks_fill("put", tmp_path, spill=False)
    assert put == shm and put_refused == shm_refused == 2
    assert sorted(put.values()) == [("dram",), ("dram",)]
    spilled, refused = await _own_blocks_fill("put", tmp_path, spill=True)
    fastest = sorted(tiers[0] for tiers in spilled.values())
    assert refused == 0 and fastest == ["disk", "disk", "dram", "dram"]  # went on below


async def test_put_without_spill_on_in_memory_tiers_stops_the_chain_where_room_ends() -> None:
    """The replay's tiers (in memory, no shared memory) under the connector's semantics:
    the chain stops at the first block its tier has no room for; with spill it goes on
    in the next tier."""
    for spill, want in ((False, (2, 0)), (True, (2, 2))):
        fast = MemoryTier(8 * KiB, name="fast", medium=Medium.CPU)
        slow = MemoryTier(64 * KiB, name="slow", medium=Medium.DISK)
        eng, _ = _engine(fast, slow)
        chain = new_blocks(4, seed=4)
        eng.lookup_request(NS, [b.block_hash for b in chain], request_id="r")
        assert (await eng.put(NS, chain, request_id="r", spill=spill))[0] == sum(want)
        tiers = [e.tiers[0] for e in eng.index.entries()]
        assert (tiers.count("fast"), tiers.count("slow")) == want
        assert eng.stats.puts_cut == (0 if spill else 1)


class _Told(LRUPolicy):
    """LRU writing down the calls that reach it, in order."""

    def __init__(self, tiers: list[TierSpec]) -> None:
        super().__init__(tiers)
        self.told: list[tuple[str, int]] = []

    def on_request(self, req: Any, now: float) -> Any:
        self.told.append(("request", len(req.keys)))
        return super().on_request(req, now)

    def on_access_many(self, keys: Any, tiers: Any, now: float) -> None:
        self.told.append(("hits", len(keys)))
        super().on_access_many(keys, tiers, now)

    def on_insert(self, info: Any, tier: str, now: float) -> None:
        self.told.append(("insert", 1))
        super().on_insert(info, tier, now)


async def test_a_served_lookup_answers_before_its_hits_bookkeeping_in_the_same_order() -> None:
    """The hits' recency reaches the policy after the answer: once the loop is free and
    what was ready then has run, or before the policy's next call, whichever is first
    (the calls it always got, in the order it always got them); the synchronous lookup
    tells it at once."""
    tier = MemoryTier(64 * KiB, name="fast", medium=Medium.CPU)
    policy = _Told([TierSpec(tier.name, tier.capacity_bytes)])
    eng = Engine([tier], policy, RecordingSink(), clock=Clock())
    await eng.start()
    try:
        a, b = new_blocks(3, seed=5), new_blocks(2, seed=6)
        await eng.put(NS, a)
        await eng.put(NS, b)
        policy.told.clear()
        found = await eng.serve_lookup(NS, [x.block_hash for x in a], request_id="r1")
        assert found.media == [Medium.CPU] * 3
        assert policy.told == [("request", 3)]  # answered; the hits not told yet
        # Another caller's turn, ready when the Lookup ended, runs before the bookkeeping.
        seen: list[list[tuple[str, int]]] = []
        asyncio.get_running_loop().call_soon(lambda: seen.append(list(policy.told)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert seen == [[("request", 3)]]
        assert policy.told == [("request", 3), ("hits", 3)]
        # not let go in between: the next call reaches the policy after the hits
        policy.told.clear()
        await eng.serve_lookup(NS, [x.block_hash for x in a], request_id="r2")
        await eng.put(NS, new_blocks(1, seed=7))
        assert policy.told[:4] == [("request", 3), ("hits", 3), ("request", 1), ("insert", 1)]
        policy.told.clear()
        eng.lookup_request(NS, [x.block_hash for x in b], request_id="r3")
        assert policy.told == [("request", 2), ("hits", 2)]
    finally:
        await eng.close()


async def test_serve_lookup_feeds_the_profile_once_per_request_and_holds() -> None:
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng, _ = _engine(dram)
    profile = LiveProfile()
    eng.profile = profile
    SlotPlane.for_engine(eng)
    await eng.start()
    try:
        chain = new_blocks(3, seed=5)
        hashes = [b.block_hash for b in chain]
        await eng.put(NS, chain)
        found = await eng.serve_lookup(NS, hashes, "s1", request_id="r", hold=True, owner="me")
        assert found.media == [Medium.CPU] * 3 and not found.repeat
        assert found.held is not None
        lease, slots = found.held
        assert [s is not None and s[0] is not None for s in slots] == [True] * 3
        assert all(BlockKey(NS, h) in eng.leases.pins for h in hashes)
        again = await eng.serve_lookup(NS, hashes, "s1", request_id="r")
        assert again.repeat and again.held is None
        await asyncio.sleep(0)  # (the profile is told once the answer is out,
        await asyncio.sleep(0)  # two turns on)
        snap = profile.snapshot()
        assert snap.requests == 1  # the repeat is not a request of its own
        assert eng.stats.lookups == 1
    finally:
        await eng.close()


def test_the_engine_validates_a_hint_whoever_sends_it() -> None:
    fast = MemoryTier(64 * KiB, name="fast", medium=Medium.CPU)
    eng, _ = _engine(fast)
    with pytest.raises(InvalidArgument, match="unknown event 'lunch'"):
        eng.hint(Hint("s", "lunch"), NS)
    with pytest.raises(InvalidArgument, match="expected_gap_ms"):
        eng.hint(Hint("s", "tool_call", expected_gap_s=float("nan")), NS)
    with pytest.raises(InvalidArgument, match="expected_gap_ms"):
        eng.hint(Hint("s", "tool_call", expected_gap_s=-1.0), NS)
    with pytest.raises(InvalidArgument, match="namespace"):
        eng.hint(Hint("s", "turn_end"), "")
    with pytest.raises(InvalidArgument, match="unknown workload"):
        eng.hint(Hint("s", "turn_end", workload="lunch"), NS)
    assert eng.hint(Hint("s", "turn_end"), NS) == 0
