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


def _python_lines(fn: Any) -> int:
    """Lines of Python run while ``fn()`` runs (a C-level pass over blocks runs none)."""
    import sys

    lines = [0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            lines[0] += 1
        return local

    old = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local)
    try:
        fn()
    finally:
        sys.settrace(old)
    return lines[0]


async def test_a_first_lookup_of_a_stored_chain_runs_no_python_line_per_block() -> None:
    """The lookup the connector makes once per waiting request, of a chain earlier
    requests stored (DRAM and disk, the default policy): the index read, the request
    the policy is told of, the policy's bookkeeping, the session's use of its blocks
    and the touches run in C-level passes over the blocks, not lines of Python per
    block: as many lines for 400 blocks as for 40, whether the request names its
    session, a new one, or none (issue 25)."""
    from kvstore.policies.adaptive import AdaptivePolicy

    from kvstore.tiers.memory import MemoryTier
    from kvstore.types import Medium

    async def lines_for(n: int) -> list[int]:
        tiers = [MemoryTier(4 << 20, name="dram", medium=Medium.CPU),
                 MemoryTier(16 << 20, name="disk", medium=Medium.DISK)]
        policy = AdaptivePolicy([TierSpec(t.name, t.capacity_bytes) for t in tiers])
        eng = Engine(list(tiers), policy, RecordingSink(), clock=Clock())
        await eng.start()
        chain = new_blocks(n, size=1 * KiB, seed=11)
        hashes = [b.block_hash for b in chain]
        await eng.put("ns", chain, "a")
        await eng.mover.drain()
        for rid, sid in enumerate(("a", "b", "", "a")):  # looked up before
            eng.lookup_request("ns", hashes, sid, request_id=f"r{rid}")
        out = [_python_lines(lambda rid=rid, sid=sid: eng.lookup_request(
            "ns", hashes, sid, request_id=rid)) for rid, sid in (("x", "a"), ("y", "c"), ("z", ""))]
        await eng.close()
        return out

    # One line of Python per block would be 360 more lines per call at 400 blocks; the
    # guard's branches (a proof made at one size and not the other, a deferred
    # bookkeeping pass run in one call and not the other) may differ by a few lines
    # whatever the size: seen once as 750 against 740 in a full run, never alone.
    many, few = await lines_for(400), await lines_for(40)
    assert all(abs(a - b) <= 40 for a, b in zip(many, few, strict=True)), (many, few)


def test_a_sessions_use_of_its_blocks_records_what_the_per_key_loop_did() -> None:
    """``Sessions.used`` in C-level passes records the users, first users (two
    generations) and session keys the loop over the keys recorded, in the same order:
    sessions that come back, new ones on another's prefix, repeated keys, expiry."""
    from kvstore.engine.sessions import Sessions
    from kvstore.types import SessionKey

    class Loop(Sessions):
        def used(self, session: SessionKey, keys: Sequence[Hashable], now: float) -> None:
            s = self._sessions.get(session)
            if s is None:
                s = self._sessions[session] = _LoopSession()
            else:
                self._sessions.move_to_end(session)
            s.last = now
            mine, users, first = s.keys, self._users, self._first
            for k in keys:
                if k not in mine:
                    mine[k] = None
                    users[k] = users.get(k, 0) + 1
                    if k in first:
                        if first[k] != session:
                            first[k] = None
                    else:
                        old = self._old_first.get(k, session)
                        first[k] = None if old != session else session
            if len(first) > self.max_inferred:
                self._old_first, self._first = first, {}
            self.expire(now)

    from kvstore.engine.sessions import _Session as _LoopSession

    rng = random.Random(9)
    fast, ref = Sessions(ttl_s=50.0, max_sessions=6, max_inferred=40), Sessions(
        ttl_s=50.0, max_sessions=6, max_inferred=40)
    ref.__class__ = Loop
    chains: dict[int, list[tuple[int, int]]] = {}
    for step in range(1500):
        sid = rng.randrange(9)
        chain = chains.setdefault(sid, [(-1, j) for j in range(rng.choice((0, 2, 5)))])
        chain.extend((sid, step * 10 + j) for j in range(rng.choice((0, 1, 3))))
        keys: list[Hashable] = list(chain)
        if rng.random() < 0.2 and chains:
            keys = list(chains[rng.choice(list(chains))])  # another session's prefix
        if rng.random() < 0.05 and keys:
            keys.append(keys[0])
        session = SessionKey("ns", str(sid))
        for s in (fast, ref):
            s.used(session, keys, float(step))
        if rng.random() < 0.03:
            for s in (fast, ref):
                s.end(session)
        assert list(fast._users.items()) == list(ref._users.items()), step
        assert list(fast._first.items()) == list(ref._first.items()), step
        assert list(fast._old_first.items()) == list(ref._old_first.items()), step
        assert [(n, list(v.keys), v.last) for n, v in fast._sessions.items()] == [
            (n, list(v.keys), v.last) for n, v in ref._sessions.items()], step
