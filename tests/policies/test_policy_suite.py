"""One suite over every registered policy: the engine's contract with a policy.

The server's own engine (in-memory tiers, a virtual clock, the mover run
between requests) drives each policy over generated traffic (shared prefixes,
branches, hints, read leases pinning blocks) across three tiers, through its
eviction manager, checked on every eviction: victims free enough bytes or none
are chosen (atomic), no protected block is chosen, every victim is in the tier,
and no block is evicted while a block that extends it stays cached in the same
tier. Capacity is checked after every request. The same holds when each policy's
order is turned hostile (protected keys first, parents before children): the
rules are the manager's, not the policy's.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Container, Hashable

import pytest
from kvstore.policies.base import BlockInfo, Hint, Plan, Policy, RequestInfo, TierSpec, Wrapper

from kvstore import policies
from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine
from kvstore.engine.eviction import EvictionManager
from kvstore.tiers.memory import MemoryTier
from kvstore.types import BlockKey, Medium

BLOCK = 100
TIERS = [TierSpec("hbm", 20 * BLOCK, 1e13), TierSpec("dram", 30 * BLOCK, 25e9),
         TierSpec("disk", 50 * BLOCK, 3e9)]
MEDIA = {"hbm": Medium.GPU, "dram": Medium.CPU, "disk": Medium.DISK}


class Checked(Wrapper):
    """Asserts the placement half of the contract on the way through."""

    name = "checked"

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        plan = self.inner.on_request(req, now)
        missing = {k for k, t in zip(req.keys, req.hit_tiers, strict=True) if t is None}
        assert set(plan.admit) <= missing, "a plan admits only the request's missing keys"
        return plan

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        dst = self.inner.demote_to(key, tier, now)
        assert dst is None or self._order[dst] > self._order[tier], "demotion goes down"
        return dst


class Hostile(Wrapper):
    """The inner policy's order turned against the rules: the protected keys first, then
    every block after its cached ancestors (parents before children). The manager must
    still take children first and no protected key."""

    name = "hostile"

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.parent: dict[str, dict[Hashable, Hashable | None]] = {t.name: {} for t in self.tiers}

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self.parent[tier][info.key] = info.parent
        self.inner.on_insert(info, tier, now)

    def on_remove(self, key: Hashable, tier: str) -> None:
        self.parent[tier].pop(key, None)
        self.inner.on_remove(key, tier)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> list[Hashable]:
        parents = self.parent[tier]
        # (S3-FIFO's walk may offer a block more than once: twice the blocks is plenty)
        order = list(itertools.islice(self.inner.victims(tier, protected, now),
                                      2 * len(parents)))
        out = [k for k in parents if k in protected]  # whether the inner offers them or not
        seen = set(out)
        for key in order:
            line: list[Hashable] = []
            node: Hashable | None = key
            while node is not None and node in parents and node not in seen:
                seen.add(node)
                line.append(node)
                node = parents[node]
            out.extend(reversed(line))  # the oldest ancestor first
        return out


class CheckedEviction(EvictionManager):
    """The engine's eviction manager, asserting the contract on every eviction."""

    def __init__(self, inner: Policy, engine_ref: list[Engine]) -> None:
        super().__init__(inner)
        self.ref = engine_ref
        self.evictions = 0

    def evict(self, tier: str, nbytes: int, protected: Container[Hashable], now: float
              ) -> list[Hashable] | None:
        victims = super().evict(tier, nbytes, protected, now)
        if victims is None:
            return None
        eng = self.ref[0]
        assert len(set(victims)) == len(victims), "duplicate victim"
        for v in victims:
            entry = eng.index.get(v)  # type: ignore[arg-type]
            assert entry is not None and tier in entry.tiers, f"victim {v!r} is not in {tier}"
            assert v not in protected, f"protected block {v!r} evicted"
        assert sum(eng.index.get(v).meta.size for v in victims) >= nbytes, "freed too little"
        gone: set[Hashable] = set()
        for v in victims:
            gone.add(v)
            for e in eng.index.entries():
                if (tier in e.tiers and e.meta.parent_hash is not None
                        and BlockKey(e.key.namespace, e.meta.parent_hash) == v):
                    assert e.key in gone, f"parent {v!r} evicted before its child {e.key!r}"
        self.evictions += 1
        return victims


def make_engine(name: str, hostile: bool = False) -> tuple[Engine, CheckedEviction]:
    ref: list[Engine] = []
    policy: Policy = Checked(policies.create(name, TIERS))
    pol = CheckedEviction(Hostile(policy) if hostile else policy, ref)
    tiers = [MemoryTier(t.capacity_bytes, name=t.name, medium=MEDIA[t.name]) for t in TIERS]
    clock = Clock()
    eng = Engine(tiers, pol, clock=clock, max_block_bytes=BLOCK)
    assert eng.policy is pol
    eng.set_geometry("ns", BLOCK, 16)
    ref.append(eng)
    return eng, pol


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _h(i: int) -> bytes:
    return i.to_bytes(8, "big")


def drive(name: str, seed: int = 0, steps: int = 300, hostile: bool = False
          ) -> tuple[Engine, CheckedEviction]:
    eng, pol = make_engine(name, hostile)
    rng = random.Random(seed)
    chains: dict[str, list[int]] = {}
    ids = iter(range(1_000, 10**9))
    system = [1, 2, 3]

    async def run() -> None:
        for step in range(steps):
            eng.clock.t += rng.expovariate(2.0)  # type: ignore[attr-defined]
            s = f"s{rng.randrange(12)}"
            chain = chains.get(s) or system + [next(ids)]
            chain = chain + [next(ids) for _ in range(rng.randint(1, 3))]
            chains[s] = chain
            hashes = [_h(i) for i in chain]
            rid = f"r{step}"
            lease = None
            stored = [k for k in eng.index.entries()]
            if stored:
                pinned = tuple(e.key for e in rng.sample(stored, min(3, len(stored))))
                lease = eng.leases.acquire(pinned, eng.clock(), 60.0)
            media = eng.lookup("ns", hashes, s, "agent", request_id=rid)
            await eng.mover.run_pending()
            blocks = [NewBlock(hashes[j], hashes[j - 1] if j else None, (), b"x" * BLOCK, 16)
                      for j in range(len(media), len(hashes))]
            try:
                await eng.put("ns", blocks, s, "agent", request_id=rid)
            except Exception as exc:  # only "no room at all" is allowed
                assert type(exc).__name__ == "TierFull", exc
            event = rng.choice(["tool_call", "turn_end", "session_end", "tool_result"])
            eng.hint(Hint(s, event, "agent", "search" if event == "tool_call" else None),
                     "ns", rid)
            await eng.mover.run_pending()
            if lease is not None:
                eng.leases.release(lease.lease_id, eng.clock())
                await eng.free_deferred()
            for t in TIERS:
                tier = eng.tiers[t.name]
                assert tier.used_bytes <= tier.capacity_bytes, "capacity exceeded"
            if event == "session_end":
                chains.pop(s, None)

    asyncio.run(run())
    return eng, pol


@pytest.fixture(params=policies.available())
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_invariants_under_traffic(name: str) -> None:
    _eng, pol = drive(name)
    assert pol.evictions > 0, "the traffic must put the tiers under pressure"


def test_invariants_hold_when_the_order_is_hostile(name: str) -> None:
    """Each policy's order with protected keys first and parents before children: the
    engine still evicts children first and never a protected block."""
    _eng, pol = drive(name, steps=150, hostile=True)
    assert pol.evictions > 0, "the traffic must put the tiers under pressure"


def test_the_manager_overrules_a_parent_first_order(name: str) -> None:
    m = EvictionManager(Hostile(policies.create(name, TIERS)))
    for i in range(6):  # a chain, stored parent first
        m.on_insert(BlockInfo(i, BLOCK, i - 1 if i else None), "hbm", float(i))
    for i in (10, 11):
        m.on_insert(BlockInfo(i, BLOCK), "hbm", 6.0)
    assert list(m.inner.victims("hbm", {10, 11}, 7.0))[:3] == [10, 11, 0], "hostile indeed"
    assert m.evict("hbm", 3 * BLOCK, {10, 11}, 7.0) == [5, 4, 3]
    assert m.evict("hbm", 7 * BLOCK, {10, 11}, 7.0) is None, "only 6 unprotected blocks"


def test_eviction_is_atomic(name: str) -> None:
    pol = EvictionManager(policies.create(name, TIERS))
    for i in range(5):
        pol.on_insert(BlockInfo(i, BLOCK, i - 1 if i else None), "hbm", float(i))
    before = pol.evict("hbm", 3 * BLOCK, {0, 1, 2, 3}, 10.0)
    assert before is None, "cannot free 3 blocks when 4 of 5 are protected"
    victims = pol.evict("hbm", BLOCK, {0, 1, 2, 3}, 10.0)
    assert victims == [4]


def test_protected_never_evicted(name: str) -> None:
    pol = EvictionManager(policies.create(name, TIERS))
    for i in range(10):
        pol.on_insert(BlockInfo(i, BLOCK), "hbm", float(i))
    assert pol.evict("hbm", BLOCK, set(range(10)), 20.0) is None
    victims = pol.evict("hbm", 2 * BLOCK, {0, 1, 2}, 20.0)
    assert victims is not None and not {0, 1, 2} & set(victims)


def test_child_before_parent(name: str) -> None:
    pol = EvictionManager(policies.create(name, TIERS))
    # Parent stored before its child (the opposite of vLLM's free order).
    for i in range(6):
        pol.on_insert(BlockInfo(i, BLOCK, i - 1 if i else None), "hbm", float(i))
    victims = pol.evict("hbm", BLOCK, set(), 10.0)
    assert victims is not None
    gone = set(victims)
    for v in victims:
        assert v + 1 >= 6 or v + 1 in gone, f"block {v} evicted before its child"
    assert victims.index(max(victims)) == 0 or len(victims) == 1 or victims == sorted(
        victims, reverse=True)


def test_child_with_protected_descendant_is_kept(name: str) -> None:
    pol = EvictionManager(policies.create(name, TIERS))
    for i in range(4):
        pol.on_insert(BlockInfo(i, BLOCK, i - 1 if i else None), "hbm", float(i))
    # The leaf is pinned: none of its ancestors may go.
    assert pol.evict("hbm", BLOCK, {3}, 10.0) is None


def test_deterministic(name: str) -> None:
    (a, _), (b, _) = drive(name, seed=7, steps=150), drive(name, seed=7, steps=150)
    assert ({e.key: tuple(e.tiers) for e in a.index.entries()}
            == {e.key: tuple(e.tiers) for e in b.index.entries()})
