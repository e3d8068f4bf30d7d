"""The eviction orders the policies compute once and reuse are the orders computed
afresh: the workload policy's sessions sorted by value (once per instant, epoch and
set of owners, issue 24) and ARC's candidate order (a chain of iterators), checked
against the code they replaced on random states, victims, plans, demotions and the
learned state alike."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kvstore.policies._owners import Pool
from kvstore.policies.base import BlockInfo, Hint, RequestInfo, TierSpec
from kvstore.policies.vllm_native import _ARC
from kvstore.policies.workload import WorkloadPolicy

TIERS = [TierSpec("dram", 20, 20e9), TierSpec("disk", 40, 3e9)]


# -- the references: the code before the caches ------------------------------------------
class _Uncached(WorkloadPolicy):
    """Every value and every order computed afresh at every call."""

    def _value_at(self, name: Hashable, now: float) -> float:
        if isinstance(name, Pool):
            return self._pool_value(name, now)
        s = self._sessions.get(name)
        v: float = 0.0 if s is None else self._value_of(s, now)
        return v

    def _worst_first(self, tier: str, now: float, skip: Hashable | None = None
                     ) -> list[tuple[float, Hashable]]:
        order: list[tuple[float, Hashable]] = self._t[tier].worst_first(
            lambda o: self._value_at(o, now), skip)
        return order


def _arc_order(arc: _ARC) -> Iterator[Hashable]:
    virtual = len(arc.t1)
    t1, t2 = iter(arc.t1.items()), iter(arc.t2.items())
    while True:
        item = None
        if virtual >= int(arc.target):
            item = next(t1, None)
            if item is not None:
                virtual -= 1
        if item is None:
            item = next(t2, None)
            if item is None:
                item = next(t1, None)
                if item is None:
                    return
        yield item[0]


# -- ARC ------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.integers(0, 12), st.floats(0.0, 30.0), st.integers(0, 30))
def test_arc_order_is_the_generators(n1: int, n2: int, target: float, read: int) -> None:
    arc = _ARC(100)
    arc.t1 = OrderedDict((("a", j), 1) for j in range(n1))
    arc.t2 = OrderedDict((("b", j), 1) for j in range(n2))
    arc.target = target
    assert list(arc.order()) == list(_arc_order(arc))
    it, ref = arc.order(), _arc_order(arc)  # read partly, as the eviction manager does
    assert [next(it, None) for _ in range(read)] == [next(ref, None) for _ in range(read)]


# -- the workload policy ------------------------------------------------------------------
def _state(p: WorkloadPolicy) -> tuple[Any, ...]:
    returns = [(c, k.n, list(k.cnt), k.cdf, k.dirty) for c, k in p.returns._classes.items()]
    sessions = [(n, s.wait, s.tool, s.since, s.turns, s.last_gap, s.cls, s.gap, s.next)
                for n, s in p._sessions.items()]
    tiers = [(name, list(tr.owner.items()), list(tr.pos.items()),
              [(s, list(b)) for s, b in tr._blocks.items()]) for name, tr in p._t.items()]
    return (returns, sessions, tiers, sorted(p._vcache.items(), key=repr),
            {w: dict(c) for w, c in p.follows.items()}, list(p._uses.items()))


def _drive(seed: int, steps: int) -> int:
    """Both policies through one random mix (named sessions of two workloads, shared
    prefixes, hints, two tiers; a request's blocks stored later, block by block, after
    other requests and hints maybe, at one instant or two); returns how many victim
    orders the cached policy read at an instant and epoch it had read one at already."""
    rng = random.Random(seed)
    fast, ref = WorkloadPolicy(TIERS), _Uncached(TIERS)
    both = (fast, ref)
    stored: dict[str, set[Hashable]] = {t.name: set() for t in TIERS}
    cap = {t.name: t.capacity_bytes for t in TIERS}
    chains: dict[int, list[Hashable]] = {}
    pending: list[tuple[RequestInfo, list[tuple[Hashable, str]]]] = []
    now = 0.0
    reused = 0
    read_at: set[tuple[float, int]] = set()

    def tier_of(k: Hashable) -> str | None:
        return next((t.name for t in TIERS if k in stored[t.name]), None)

    def make_room(t: str, protected: set[Hashable]) -> bool:
        nonlocal reused
        at = (now, fast._epoch)
        reused += at in read_at
        read_at.add(at)
        orders = [list(p.victims(t, protected, now)) for p in both]
        assert orders[0] == orders[1]
        v = next((v for v in orders[0] if v not in protected and v in stored[t]), None)
        if v is None:
            return False
        dsts = [p.demote_to(v, t, now) for p in both]
        assert dsts[0] == dsts[1]
        stored[t].discard(v)
        for p in both:
            p.on_remove(v, t)
        dst = dsts[0]
        if dst is not None and v not in stored[dst] and len(stored[dst]) < cap[dst]:
            stored[dst].add(v)
            for p in both:
                p.on_insert(BlockInfo(v, 1, None, "", "agent"), dst, now)
        return True

    def store(req: RequestInfo, admit: list[tuple[Hashable, str]]) -> None:
        protected = set(req.keys)
        for k, t in admit:  # one by one, room made for each
            if tier_of(k) is not None:
                continue
            if len(stored[t]) >= cap[t] and not make_room(t, protected):
                return
            stored[t].add(k)
            for p in both:
                p.on_insert(BlockInfo(k, 1, None, req.session_id, req.workload, 16,
                                      len(req.keys)), t, now)

    for step in range(steps):
        now += rng.choice((0.0, 0.0, 0.0, 0.5, 2.0, 7.0, 45.0, 400.0, 3000.0))
        sid = rng.randrange(8)
        name, workload = f"s{sid}", ("agent", "chat")[sid % 2]
        roll = rng.random()
        if roll < 0.2:
            hint = Hint(name, rng.choice(Hint.EVENTS), workload,
                        rng.choice((None, "bash", "x")), rng.choice((None, None, 5.0, 90.0)))
            keys_of = [(k, t) for k in chains.get(sid, []) if (t := tier_of(k)) is not None]
            moves = [p.on_hint(hint, keys_of, now) for p in both]
            assert moves[0] == moves[1], step
        elif roll < 0.45 and pending:
            req, admit = pending.pop(rng.randrange(len(pending)))
            half = rng.randrange(len(admit) + 1)
            store(req, admit[:half])
            now += rng.choice((0.0, 3.0))
            store(req, admit[half:])
        else:
            chain = chains.setdefault(
                sid, [(workload, j) for j in range(rng.choice((0, 2, 6)))])
            chain.extend((sid, step, j) for j in range(rng.choice((1, 3, 8))))
            keys = (list(chain) if rng.random() < 0.8
                    else [(workload, j) for j in range(rng.choice((2, 6)))])
            first = [tier_of(k) for k in keys]
            nhit = first.index(None) if None in first else len(first)
            hit = first[:nhit] + [None] * (len(keys) - nhit)
            req = RequestInfo(keys, hit, name, workload, 1, 16, rng.choice((16, 5)),
                              then=rng.choice(("", "tool_call", "turn_end", "session_end")),
                              tool=rng.choice(("", "bash")))
            plans = [p.on_request(req, now) for p in both]
            assert plans[0] == plans[1], step
            if nhit:
                for p in both:
                    p.on_access_many(keys[nhit - 1::-1], hit[nhit - 1::-1], now)
            pending.append((req, list(plans[0].admit.items())))
        if rng.random() < 0.1:  # a block dropped out of turn
            t = rng.choice(TIERS).name
            if stored[t]:
                v = rng.choice(sorted(stored[t], key=repr))
                stored[t].discard(v)
                for p in both:
                    p.on_remove(v, t)
        assert _state(fast) == _state(ref), step
    return reused


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_cached_victims_are_the_fresh_sort(seed: int) -> None:
    _drive(seed, 300)


def test_the_mix_reuses_orders() -> None:
    assert sum(_drive(seed, 300) for seed in range(3)) > 50  # the cache is exercised


def test_a_second_eviction_at_one_instant_values_no_session_again() -> None:
    p = WorkloadPolicy([TierSpec("dram", 8)])
    for sid in range(4):
        keys = [(sid, j) for j in range(2)]
        p.on_request(RequestInfo(keys, [None, None], f"s{sid}", "agent", 1, 16, 16), 1.0)
        for k in keys:
            p.on_insert(BlockInfo(k, 1, None, f"s{sid}", "agent", 16, 2), "dram", 1.0)
    calls = 0
    value_of = p._value_of

    def counted(*a: Any) -> float:
        nonlocal calls
        calls += 1
        v: float = value_of(*a)
        return v

    p._value_of = counted
    first = next(iter(p.victims("dram", (), 5.0)))
    assert calls == 4  # every session valued once
    p.on_remove(first, "dram")
    assert next(iter(p.victims("dram", (), 5.0))) != first
    assert calls == 4  # the same instant: the values (and their order) are reused
    next(iter(p.victims("dram", (), 6.0)))
    assert calls == 8  # a later instant: valued again
