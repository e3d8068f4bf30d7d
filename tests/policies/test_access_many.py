"""``on_access_many`` (a lookup's hits in one call) is ``on_access`` of each, in order,
and ``on_insert_many`` (a commit's blocks in one call) is ``on_insert`` of each, for
every registered policy: the same eviction order and the same next plan after it. And
what a policy leaves for ``settle`` changes none of it, whenever ``settle`` comes."""

from __future__ import annotations

import random

import pytest
from kvstore.policies.base import BlockInfo, Policy, RequestInfo, TierSpec
from kvstore.policies.lru import LRUPolicy

from kvstore import policies

BLOCK = 100
TIERS = [TierSpec("dram", 30 * BLOCK, 25e9), TierSpec("disk", 60 * BLOCK, 3e9)]


def _flush(policy: Policy, run: list[BlockInfo], tier: str, now: float) -> None:
    if run:
        policy.on_insert_many(list(run), tier, now)
        run.clear()


class _Settling:
    """A policy that settles after every call (what it left for later done at once)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __getattr__(self, name: str) -> object:
        call = getattr(self.policy, name)

        def settled(*args: object) -> object:
            out = call(*args)
            if name != "victims":  # (an order read lazily: settled at the next call)
                self.policy.settle()
            return out

        return settled


def _drive(policy: Policy, batched: bool, seed: int, inserts: bool = False,
           named: bool = True, stores: bool = False) -> list[object]:
    """Lookups over shared and private chains, with stores and evictions as the engine
    makes them (a full tier gives up the policy's first victim); what the policy said.
    ``named``: the requests name their session (else the engine inferred it);
    ``stores``: every other request is a store no lookup announced (its hits not
    touched: the next call after its plan is an eviction or an insert)."""
    rng = random.Random(seed)
    seen: list[object] = []
    where: dict[object, str] = {}
    room = {t.name: t.capacity_bytes // BLOCK for t in TIERS}
    now = 0.0
    for step in range(80):
        now += rng.choice((0.5, 3.0, 40.0))
        session = f"s{rng.randrange(4)}"
        keys: list[object] = [("shared", rng.randrange(3), i) for i in range(rng.randrange(2, 6))]
        keys += [(session, step, i) for i in range(rng.randrange(1, 5))]
        hit = [where.get(k) for k in keys]
        req = RequestInfo(keys, hit, session_id=session, workload="chat", block_bytes=BLOCK,
                          block_tokens=16, last_tokens=16, session_named=named)
        plan = policy.on_request(req, now)
        seen.append((sorted(map(str, plan.admit.items())), plan.keep_s))
        hits = [(k, t) for k, t in zip(keys, hit, strict=True) if t is not None][::-1]
        if stores and step % 2:
            pass
        elif batched:
            policy.on_access_many([k for k, _ in hits], [t for _, t in hits], now)
        else:
            for k, t in hits:
                policy.on_access(k, t, now)
        # (with ``inserts``, the blocks stored between two evictions into one tier go
        # in one on_insert_many call, as a commit tells the policy)
        run: list[BlockInfo] = []
        run_tier = ""
        for k, t in zip(keys, hit, strict=True):
            tier = plan.admit.get(k)
            if t is not None or tier is None:
                continue
            if not room[tier]:
                _flush(policy, run, run_tier, now)
                victim = next(iter(policy.victims(tier, frozenset(keys), now)), None)
                if victim is None:
                    continue
                policy.on_remove(victim, tier)
                del where[victim]
                room[tier] += 1
                seen.append(("evicted", str(victim)))
            info = BlockInfo(k, BLOCK, session_id=session, workload="chat")
            if not inserts:
                policy.on_insert(info, tier, now)
            else:
                if tier != run_tier:
                    _flush(policy, run, run_tier, now)
                run_tier = tier
                run.append(info)
            where[k] = tier
            room[tier] -= 1
        _flush(policy, run, run_tier, now)
        for tier in room:
            seen.append((tier, [str(k) for k in policy.victims(tier, frozenset(), now)]))
    return seen


@pytest.mark.parametrize("name", policies.available())
def test_on_access_many_is_on_access_of_each(name: str) -> None:
    for seed in (1, 2, 3):
        one, many = policies.create(name, TIERS), policies.create(name, TIERS)
        assert _drive(many, True, seed) == _drive(one, False, seed)


@pytest.mark.parametrize("name", policies.available())
def test_on_insert_many_is_on_insert_of_each(name: str) -> None:
    for seed in (1, 2, 3):
        one, many = policies.create(name, TIERS), policies.create(name, TIERS)
        assert _drive(many, False, seed, inserts=True) == _drive(one, False, seed)


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
@pytest.mark.parametrize("name", policies.available())
def test_what_a_policy_leaves_for_settle_changes_nothing(name: str, named: bool) -> None:
    """A policy left alone (it settles at its next call) says what one settled after
    every call says: the same plans, victims and evictions (the engine settles once its
    loop is free, after a lookup's answer)."""
    for seed in range(1, 9):
        alone, settled = policies.create(name, TIERS), policies.create(name, TIERS)
        assert _drive(alone, True, seed, named=named, stores=True) == _drive(
            _Settling(settled), True, seed, named=named, stores=True)  # type: ignore[arg-type]


class _Counting(LRUPolicy):
    """An LRU subclass with an insert of its own (and no batched one)."""

    def __init__(self, tiers: list[TierSpec]) -> None:
        super().__init__(tiers)
        self.seen: list[object] = []

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self.seen.append(info.key)
        super().on_insert(info, tier, now)


def test_a_subclass_that_overrides_on_insert_sees_every_batched_insert() -> None:
    pol = _Counting(TIERS)
    pol.on_insert_many([BlockInfo(("k", i), BLOCK) for i in range(3)], "dram", 0.0)
    assert pol.seen == [("k", 0), ("k", 1), ("k", 2)]
    assert list(pol.victims("dram", frozenset(), 0.0)) == pol.seen
