"""The one-pass (C-level) paths of the default policy's hot loops decide exactly as the
per-key loops they stand for: the same plans, leader, scores and eviction orders on a
generated mix of named and unnamed sessions, shared prefixes, partial hits and two
tiers. The reference below is the per-key code those paths replaced (issue 25)."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from itertools import repeat
from typing import Any

from kvstore.policies._owners import TierOwners
from kvstore.policies.adaptive import AdaptivePolicy, LRUGhost
from kvstore.policies.base import BlockInfo, Plan, RequestInfo, TierSpec
from kvstore.policies.children import ChildIndex, ghost_take
from kvstore.policies.counts import Counted, CountTier, ReuseCounts
from kvstore.policies.frequency import FrequencyPolicy
from kvstore.policies.lru import LRUPolicy
from kvstore.policies.returns import ReturnTimes
from kvstore.policies.shadow import FrequencyGhost, Retained
from kvstore.policies.workload import WorkloadPolicy

TIERS = [TierSpec("dram", 24, 20e9), TierSpec("disk", 60, 3e9)]


# -- the per-key reference --------------------------------------------------------------
class _RefTier(CountTier):
    def file_many(self, keys: Sequence[Hashable], count: Any, *_: Any) -> None:
        for k in keys:  # (the caller's distinct keys and counts not used)
            if k in self.at:
                self.file(k, count(k, 0))


class _RefGhostLRU(LRUGhost):
    def _hits(self, keys: Sequence[Hashable]) -> int:
        hits = 0
        for k in keys:
            if k not in self.keys:
                break
            hits += 1
        return hits

    def request(self, keys: Sequence[Hashable], size: int, now: float = 0.0,
                own: Sequence[Hashable] = ()) -> int:
        hits = self._hits(keys)
        self.lost = self.store(keys, 0, size, now, own)
        return hits

    def lookup(self, keys: Sequence[Hashable]) -> int:
        hits = self._hits(keys)
        for j in range(hits - 1, -1, -1):
            self.keys.move_to_end(keys[j])
        self.lost = sum(1 for k in keys[hits:] if k in self.gone)
        return hits

    def store(self, keys: Sequence[Hashable], start: int, size: int, now: float = 0.0,
              own: Sequence[Hashable] = ()) -> int:
        ghost = self.keys
        lost = 0
        added = []
        for j in range(len(keys) - 1, start - 1, -1):
            k = keys[j]
            if k in ghost:
                ghost.move_to_end(k)
            else:
                n = self.gone.pop(k, None)
                if n is not None:
                    lost += 1
                    self.gone_used -= n
                self.used += size
                ghost[k] = size
                added.append(k)
                self.children.add(k, keys[j - 1] if j else None, size)
        if self.used > self.capacity:
            # (the engine's eviction rule, shared: ghost_take)
            shield = (self.retained.shield(ghost, self.capacity, now) if self.retained
                      else None)
            for k in ghost_take(self.children, lambda: list(ghost), set(keys) | set(own),
                                ghost, self.used - self.capacity, shield):
                if k in ghost:
                    self._evict(k)
        for k in added:
            if self.used <= self.capacity:
                break
            if k in ghost:
                self._evict(k)
        while self.used > self.capacity and ghost:
            self._evict(next(iter(ghost)))
        while self.gone_used > self.capacity and self.gone:
            self.gone_used -= self.gone.popitem(last=False)[1]
        return lost


class _RefCounts(ReuseCounts):
    """Every add the per-key loop."""

    def add_distinct(self, keys: Sequence[Hashable], weight: int = 1) -> list[int] | None:
        return None if self.add(keys, weight) else [self[k] for k in keys]


class _RefFrequency(FrequencyPolicy):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._t = {t.name: _RefTier(t.capacity_bytes) for t in self.tiers}

    def _counts(self) -> ReuseCounts:
        if self.counts is None:
            counts = super()._counts()
            self.counts = _RefCounts(counts.period, counts.max_tracked)
        return self.counts

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        for key, tier in zip(keys, tiers, strict=True):
            self.on_access(key, tier, now)


class _RefFrequencyGhost(FrequencyGhost):
    def __init__(self, capacity: int, retained: Retained | None = None) -> None:
        self.tier = "ghost"
        self.policy = _RefFrequency([TierSpec(self.tier, capacity)])
        self.retained = retained
        self.children = ChildIndex()

    def request(self, req: RequestInfo, size: int, counted: Counted | None = None,
                now: float = 0.0) -> int:
        hits, new = self.lookup(req, size, counted)
        if new:
            self.store(req, new, size, now)
        return hits

    def lookup(self, req: RequestInfo, size: int, counted: Counted | None = None
               ) -> tuple[int, list[int]]:
        pol, name = self.policy, self.tier
        tr = pol._t[name]
        keys = req.keys
        hits = 0
        for k in keys:
            if k not in tr.at:
                break
            hits += 1
        tiers: list[str | None] = [name if k in tr.at else None for k in keys]
        info = RequestInfo(keys, tiers, req.session_id, req.workload, size, req.block_tokens,
                           req.last_tokens)
        # (the real policy's counts, read key by key: no count pass handed over)
        plan = (pol.on_request(info, 0.0) if counted is None
                else pol.on_counted(info, Counted(counted.counts, None, None)))
        pol.on_access_many([k for k in keys if k in tr.at], [name] * sum(
            1 for t in tiers if t is not None), 0.0)
        return hits, [j for j in range(len(keys) - 1, -1, -1) if keys[j] in plan.admit]

    def store(self, req: RequestInfo, new: list[int], size: int, now: float = 0.0) -> None:
        pol, name = self.policy, self.tier
        tr = pol._t[name]
        keys = req.keys
        new = [j for j in new if keys[j] not in tr.at]
        if not new:
            return
        need = len(new) * size - (tr.capacity - tr.used)
        if need > 0:
            shield = (self.retained.shield(tr.sizes, tr.capacity, now) if self.retained
                      else None)
            for v in ghost_take(self.children, lambda: list(tr.order()),
                                set(keys) | set(req.continues), tr.sizes, need, shield):
                if v in tr.at:
                    tr.drop(v)
                    self.children.remove(v)
        for j in new:
            if tr.used + size > tr.capacity:
                break
            if keys[j] not in tr.at:
                self.children.add(keys[j], keys[j - 1] if j else None, size)
            pol.on_insert(BlockInfo(keys[j], size), name, 0.0)


class _RefReturns(ReturnTimes):
    __slots__ = ()

    def returned_many(self, cls: Hashable, gaps: Sequence[float]) -> None:
        for gap in gaps:  # one gap at a time
            self.returned(cls, gap)


class _RefWorkload(WorkloadPolicy):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.returns.__class__ = _RefReturns

    def _claim_run(self, *a: Any) -> bool:
        return False  # always the per-key walk

    def _pooled_run(self, *a: Any) -> list[float] | None:
        return None  # (nor the pool's run)


class _RefLRU(LRUPolicy):
    def on_request(self, req: RequestInfo, now: float) -> Plan:
        top = self.tiers[0].name
        return Plan({k: top for k, t in zip(req.keys, req.hit_tiers, strict=True) if t is None})

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        for key, tier in zip(keys, tiers, strict=True):
            lru = self._lru[tier]
            if key in lru:
                lru.move_to_end(key)


class _RefAdaptive(AdaptivePolicy):
    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self.bets = _RefWorkload(tiers, self.cost, hbm_keep_max_s=10.0)
        self.freq = _RefFrequency(tiers, self.cost)
        self.lru = _RefLRU(tiers)
        self._bettor = self.bets

    def _start(self, block_bytes: int) -> LRUGhost:
        super()._start(block_bytes)
        self._ghost = _RefGhostLRU(self._ghost.capacity,  # type: ignore[union-attr]
                                   self._retained)
        self._fghost = _RefFrequencyGhost(self._ghost.capacity, self._retained)
        return self._ghost

    def _served(self, req: RequestInfo) -> int:
        worth = req.worth or self._worth
        n = 0
        for t in req.hit_tiers:
            if t is None or not worth[self._order[t]]:
                break
            n += 1
        return n


# -- the check ----------------------------------------------------------------------------
def _state(p: AdaptivePolicy) -> tuple[Any, ...]:
    p.settle()  # (its state once it did what it left for later: see Policy.settle)

    def tiers_of(pol: Any) -> list[Any]:
        out = []
        for name, tr in pol._t.items():
            if isinstance(tr, TierOwners):
                out.append((name, list(tr.owner.items()), list(tr.pos.items()),
                            [(s, list(b)) for s, b in tr._blocks.items()]))
            else:
                out.append((name, list(tr.at.items()),
                            sorted((c, list(b)) for c, b in tr.buckets.items())))
        return out

    counts = p.freq.counts
    returns = [(c, k.n, list(k.cnt), k.cdf, k.dirty) for c, k in p.bets.returns._classes.items()]
    return (returns, p.leader, p.switches, p.advantage, p.count_advantage, p.room_lost,
            p._bettor.name, list(p.bets._uses.items()), list(p.bets._old_uses.items()),
            tiers_of(p.bets), tiers_of(p.freq),
            list(counts._counts.items()) if counts is not None else None,
            [(t, list(o)) for t, o in p.lru._lru.items()],
            None if p._ghost is None else (list(p._ghost.keys), list(p._ghost.gone)),
            None if p._fghost is None else tiers_of(p._fghost.policy),
            list(p._retained.until.items()))


def _drive(seed: int, steps: int, retain: bool = False) -> tuple[int, int]:
    rng = random.Random(seed)
    shared = random.Random(seed + 1000)  # (its own draws: the rest of the mix as before)
    fast, ref = AdaptivePolicy(TIERS), _RefAdaptive(TIERS)
    fast.bets.max_sessions = ref.bets.max_sessions = 8  # uses turn over every 80 keys
    stored: dict[str, set[Hashable]] = {t.name: set() for t in TIERS}
    chains: dict[int, list[Hashable]] = {}
    fast_walks = [0, 0]
    walk, pooled = fast.bets._claim_run, fast.bets._pooled_run

    def counted(*a: Any) -> bool:
        done = walk(*a)
        fast_walks[0] += done
        return done

    def counted_pooled(*a: Any) -> list[float] | None:
        gaps = pooled(*a)
        fast_walks[1] += gaps is not None
        return gaps

    fast.bets._claim_run = counted  # type: ignore[method-assign]
    fast.bets._pooled_run = counted_pooled  # type: ignore[method-assign]
    for step in range(steps):
        sid = rng.randrange(10)
        chain = chains.setdefault(sid, [("sys", j) for j in range(rng.choice((0, 3, 6)))])
        chain.extend((sid, step, j) for j in range(rng.choice((0, 1, 4, 12))))
        keys = list(chain)
        if shared.random() < 0.15:  # the shared prefix alone (the pool's, once shared)
            keys = [("sys", j) for j in range(shared.choice((3, 6)))]
        if rng.random() < 0.05 and keys:
            keys.append(keys[0])  # a repeated key: the loops' order, not a set's
        if not keys:
            continue
        first: list[str | None] = [next((t.name for t in TIERS if k in stored[t.name]), None)
                                   for k in keys]
        nhit = first.index(None) if None in first else len(first)
        hit = first[:nhit] + [None] * (len(keys) - nhit)
        named = rng.random() < (0.8 if (step // 100) % 2 == 0 else 0.15)  # phases
        req = RequestInfo(keys, hit, f"s{sid}" if named else f"anon{sid}", "chat", 1, 16,
                          rng.choice((16, 5)), session_named=named,
                          worth=(True, False) if rng.random() < 0.1 else ())
        plans = [p.on_request(req, float(step)) for p in (fast, ref)]
        assert plans[0] == plans[1], step
        assert list(plans[0].admit.items()) == list(plans[1].admit.items()), step
        back = keys[nhit - 1::-1] if nhit else []
        for p in (fast, ref):
            p.on_access_many(back, hit[nhit - 1::-1] if nhit else [], float(step))  # type: ignore[arg-type]
        for k, t in plans[0].admit.items():
            if any(k in s for s in stored.values()):
                continue
            cap = next(s.capacity_bytes for s in TIERS if s.name == t)
            if len(stored[t]) >= cap:
                order = [list(p.victims(t, set(keys), float(step))) for p in (fast, ref)]
                assert order[0] == order[1], step
                v = next((v for v in order[0] if v not in keys), None)
                if v is None:
                    continue
                stored[t].discard(v)
                for p in (fast, ref):
                    p.on_remove(v, t)
            stored[t].add(k)
            for p in (fast, ref):
                p.on_insert(BlockInfo(k, 1, None, req.session_id, "chat", 16, len(keys)), t,
                            float(step))
        if retain and shared.random() < 0.2:  # a client retains the request's head
            head = keys[:shared.choice((2, 4, 8))]
            until = step + shared.choice((5.0, 30.0, 200.0))
            for p in (fast, ref):
                p.on_retain(head, until, float(step))
        if rng.random() < 0.1:  # a block dropped (expiry, deletion) out of turn
            t = rng.choice(TIERS).name
            if stored[t]:
                v = rng.choice(sorted(stored[t], key=repr))
                stored[t].discard(v)
                for p in (fast, ref):
                    p.on_remove(v, t)
        assert _state(fast) == _state(ref), step
    return fast_walks[0], fast_walks[1]


def test_one_pass_paths_decide_as_the_per_key_loops() -> None:
    for seed in range(3):
        own, pooled = _drive(seed, 400)
        assert own > 0 and pooled > 0


def test_ghosts_shield_retained_keys_as_the_per_key_loops() -> None:
    """With clients retaining prefixes, the ghosts' shield (retained keys passed over
    within the quota, taken last by deadline) decides as a key-by-key loop does."""
    for seed in range(3):
        _drive(seed, 400, retain=True)


def test_owners_claim_run_is_claim_many() -> None:
    a, b = TierOwners(100), TierOwners(100)
    for tr in (a, b):
        for j in range(6):
            tr.add(("k", j), 1, "s" if j < 4 else "t", j)
    keys = [("k", j) for j in range(6)] + [("x", 0)]
    a.claim_run(keys[:4], "s")  # owned already: positions only
    b.claim_many(zip(keys[:4], repeat("s"), range(4)))
    a.claim_run(keys, "s")  # some of another session, one not stored
    b.claim_many(zip(keys, repeat("s"), range(7)))
    assert (a.owner, a.pos, list(a.blocks_of("s"))) == (b.owner, b.pos, list(b.blocks_of("s")))
    assert not a.blocks_of("t")


def test_owners_bytes_are_their_blocks_sizes_summed() -> None:
    """What a tier's owners hold, kept per owner (the workload policy's room for a
    newcomer reads it instead of summing a session's blocks per victim), equals the sum
    of their blocks' sizes through adds, removals, claims and pools."""
    from kvstore.policies._owners import Pool

    rnd = random.Random(5)
    tr = TierOwners(10**9)
    owners: list[Hashable] = ["s1", "s2", "s3", Pool("chat"), Pool("agent")]
    keys = [("k", j) for j in range(40)]
    for step in range(3000):
        k, s = rnd.choice(keys), rnd.choice(owners)
        op = rnd.random()
        if op < 0.35:
            tr.add(k, rnd.randint(1, 9), s, rnd.randint(0, 9))
        elif op < 0.55:
            tr.remove(k)
        elif op < 0.8:
            tr.claim(k, s, rnd.randint(0, 9))
        elif op < 0.9:
            run = rnd.sample(keys, rnd.randint(1, 6))
            tr.claim_run(run, s)
        else:
            tr.claim_many([(x, rnd.choice(owners), j) for j, x in enumerate(rnd.sample(keys, 4))])
        for o in owners:
            assert tr.bytes_of(o) == sum(tr.sizes[x] for x in tr.blocks_of(o)), (step, o)
    assert sum(map(tr.bytes_of, owners)) == tr.used
