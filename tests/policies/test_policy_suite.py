"""One suite over every registered policy: the engine's contract with a policy.

A small in-test engine drives each policy over generated traffic (shared
prefixes, branches, hints, pinned blocks) across three tiers and checks, on
every eviction: victims free enough bytes or none are chosen (atomic), no
protected block is chosen, capacity is never exceeded, and no block is evicted
while a block that extends it stays cached in the same tier.
"""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest
from kvstore.policies.base import BlockInfo, Hint, Policy, TierSpec

from kvstore import policies

BLOCK = 100
TIERS = [TierSpec("hbm", 20 * BLOCK, 1e13), TierSpec("dram", 30 * BLOCK, 25e9),
         TierSpec("disk", 50 * BLOCK, 3e9)]


class Engine:
    """Exclusive tiers; the contract the server and the simulator follow."""

    def __init__(self, policy: Policy) -> None:
        self.p = policy
        self.loc: dict[Hashable, str] = {}
        self.info: dict[Hashable, BlockInfo] = {}
        self.used = {t.name: 0 for t in TIERS}
        self.cap = {t.name: t.capacity_bytes for t in TIERS}
        self.order = [t.name for t in TIERS]
        self.evictions = 0

    def _check_victims(self, tier: str, need: int, protected: set[Hashable],
                       victims: list[Hashable]) -> None:
        assert len(set(victims)) == len(victims), "duplicate victim"
        for v in victims:
            assert self.loc.get(v) == tier, f"victim {v!r} is not in {tier}"
            assert v not in protected, f"protected block {v!r} evicted"
        assert sum(self.info[v].size for v in victims) >= need, "freed too little"
        gone = set(victims)
        seen: set[Hashable] = set()
        for v in victims:
            seen.add(v)
            for k, t in self.loc.items():
                if t == tier and self.info[k].parent == v:
                    assert k in gone, f"parent {v!r} evicted while its child {k!r} stays"
                    assert k in seen, f"parent {v!r} listed before its child {k!r}"

    def place(self, info: BlockInfo, tier: str, protected: set[Hashable], now: float) -> bool:
        need = self.used[tier] + info.size - self.cap[tier]
        if need > 0:
            before = dict(self.loc)
            victims = self.p.evict(tier, need, protected, now)
            assert self.loc == before, "evict must not change placement itself"
            if victims is None:
                return False
            self._check_victims(tier, need, protected, victims)
            self.evictions += 1
            for v in victims:
                vinfo = self.info[v]
                self.remove(v)
                dst = self.p.demote_to(v, tier, now)
                if dst is not None:
                    assert self.order.index(dst) > self.order.index(tier)
                    self.place(vinfo, dst, protected, now)
        self.loc[info.key] = tier
        self.info[info.key] = info
        self.used[tier] += info.size
        assert self.used[tier] <= self.cap[tier], "capacity exceeded"
        self.p.on_insert(info, tier, now)
        return True

    def remove(self, key: Hashable) -> None:
        tier = self.loc.pop(key)
        self.used[tier] -= self.info[key].size
        self.p.on_remove(key, tier)

    def request(self, chain: list[int], session: str, now: float,
                pinned: set[Hashable]) -> None:
        tiers = [self.loc.get(k) for k in chain]
        req = BlockInfo(chain[-1], BLOCK, None, session, "agent", BLOCK, len(chain))
        for mv in self.p.on_lookup(chain, tiers, req, now):
            assert mv.src == self.loc.get(mv.key)
        protected = set(chain) | pinned
        for j in range(len(chain) - 1, -1, -1):
            k = chain[j]
            if k in self.loc:
                self.p.on_access(k, self.loc[k], now)
                continue
            info = BlockInfo(k, BLOCK, chain[j - 1] if j else None, session, "agent",
                             BLOCK, len(chain))
            dst = self.p.admit(info, now)
            if dst is not None:
                self.place(info, dst, protected, now)


def drive(name: str, seed: int = 0, steps: int = 400) -> Engine:
    eng = Engine(policies.create(name, TIERS))
    rng = random.Random(seed)
    chains: dict[str, list[int]] = {}
    ids = iter(range(1_000, 10**9))
    system = [1, 2, 3]
    now = 0.0
    for _ in range(steps):
        now += rng.expovariate(2.0)
        s = f"s{rng.randrange(12)}"
        chain = chains.get(s) or system + [next(ids)]
        chain = chain + [next(ids) for _ in range(rng.randint(1, 3))]
        chains[s] = chain
        pinned = {k for k in rng.sample(sorted(eng.loc), min(3, len(eng.loc)))}
        eng.request(chain, s, now, pinned)
        event = rng.choice(["tool_call", "turn_end", "session_end"])
        hint = Hint(s, event, "agent", "search" if event == "tool_call" else None)
        held = [(k, eng.loc[k]) for k in chain if k in eng.loc]
        for mv in eng.p.on_hint(hint, held, now):
            if eng.loc.get(mv.key) != mv.src:
                continue
            info = eng.info[mv.key]
            eng.remove(mv.key)
            if mv.dst is not None and not eng.place(info, mv.dst, {mv.key}, now):
                eng.place(info, mv.src, set(), now)
        if event == "session_end":
            chains.pop(s, None)
    return eng


@pytest.fixture(params=policies.available())
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_invariants_under_traffic(name: str) -> None:
    eng = drive(name)
    assert eng.evictions > 0, "the traffic must put the tiers under pressure"


def test_eviction_is_atomic(name: str) -> None:
    pol = policies.create(name, TIERS)
    for i in range(5):
        pol.on_insert(BlockInfo(i, BLOCK, i - 1 if i else None), "hbm", float(i))
    before = pol.evict("hbm", 3 * BLOCK, {0, 1, 2, 3}, 10.0)
    assert before is None, "cannot free 3 blocks when 4 of 5 are protected"
    victims = pol.evict("hbm", BLOCK, {0, 1, 2, 3}, 10.0)
    assert victims == [4]


def test_protected_never_evicted(name: str) -> None:
    pol = policies.create(name, TIERS)
    for i in range(10):
        pol.on_insert(BlockInfo(i, BLOCK), "hbm", float(i))
    assert pol.evict("hbm", BLOCK, set(range(10)), 20.0) is None
    victims = pol.evict("hbm", 2 * BLOCK, {0, 1, 2}, 20.0)
    assert victims is not None and not {0, 1, 2} & set(victims)


def test_child_before_parent(name: str) -> None:
    pol = policies.create(name, TIERS)
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
    pol = policies.create(name, TIERS)
    for i in range(4):
        pol.on_insert(BlockInfo(i, BLOCK, i - 1 if i else None), "hbm", float(i))
    # The leaf is pinned: none of its ancestors may go.
    assert pol.evict("hbm", BLOCK, {3}, 10.0) is None


def test_deterministic(name: str) -> None:
    a, b = drive(name, seed=7, steps=150), drive(name, seed=7, steps=150)
    assert a.loc == b.loc
