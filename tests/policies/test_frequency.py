"""Per-block reuse counts (:mod:`kvstore.policies.frequency`) and the guarded policy
betting on them where the traffic names no sessions."""

from __future__ import annotations

import random

import pytest
from kvstore.policies.adaptive import AdaptivePolicy
from kvstore.policies.base import BlockInfo, Policy, RequestInfo, TierSpec
from kvstore.policies.counts import _RESCALE, CountTier, ReuseCounts
from kvstore.policies.frequency import FrequencyPolicy

B = 1
FOUR = [TierSpec("dram", 4 * B, 20e9)]


def test_counts_age_by_halving_and_forget_the_ones() -> None:
    c = ReuseCounts(period=6)
    assert not c.add(["a", "b", "c"])
    held = c._counts
    assert c.add(["a", "b", "d"])  # 6 keys counted: every count halved
    assert (c["a"], c["b"], c["c"], c["d"]) == (1, 1, 0, 0)
    assert c.halvings == 1
    assert c._counts is held  # (no key touched: the unit doubled)
    # the ones halved to 0 are forgotten when the counts are rescaled
    for _ in range(_RESCALE - 1):
        c.add(["a"] * 6)
    assert c.halvings == _RESCALE and c.shift == 0
    assert set(c._counts) == {"a"} and len(c) == 1


def test_counts_are_bounded() -> None:
    c = ReuseCounts(period=1000, max_tracked=3)
    c.add(["a", "b", "c", "d"])
    assert len(c) == 3 and c["a"] == 0 and c["d"] == 1
    with pytest.raises(ValueError):
        ReuseCounts(period=0)


def test_the_counts_age_by_bytes_looked_up_whatever_block_size_came_first() -> None:
    """A server holds namespaces of several block sizes. The counts halve after
    ``reset`` capacities of looked-up bytes: a first lookup of 1 MiB blocks does not
    size the period for them (sized in its blocks, the period was 6 keys, and every
    lookup of 4 KiB blocks after it halved every count and refiled every stored block)."""
    kib4, mib = 4096, 1 << 20
    pol = FrequencyPolicy([TierSpec("dram", 1000 * kib4, 20e9)], reset=2.0)

    def look(keys: list[object], size: int) -> None:
        pol.on_request(RequestInfo(keys, [None] * len(keys), "", "chat", size, 16, 16), 0.0)

    look(["big"], mib)
    counts = pol.counts
    assert counts is not None and counts.period == 2 * 1000 * kib4
    # 8,192,000 bytes a period: the 1 MiB block, then 17 lookups of 100 x 4 KiB
    # (7,991,296 bytes in all) leave it unaged; the 18th ages it.
    for i in range(17):
        look([("small", i, j) for j in range(100)], kib4)
    assert counts.halvings == 0
    look([("small", 17, j) for j in range(100)], kib4)
    assert counts.halvings == 1


class _HalvedOneByOne:
    """The counts as TinyLFU halves them: every key's count halved in a new dict, the
    ones forgotten (what :class:`ReuseCounts` did until it stopped touching the keys)."""

    def __init__(self, period: int) -> None:
        self.period, self.left, self.counts = period, period, {}

    def add(self, keys: list[object], weight: int) -> None:
        for k in keys:
            self.counts[k] = self.counts.pop(k, 0) + 1
        self.left -= len(keys) * weight
        if self.left <= 0:
            self.left = self.period
            self.counts = {k: c >> 1 for k, c in self.counts.items() if c > 1}


def test_the_counts_are_tinylfus_halved_one_by_one_across_rescales() -> None:
    """Doubling the unit instead of halving every key gives the same counts, in the same
    order, through more halvings than one rescale (seeded: lookups of repeated keys)."""
    rnd = random.Random(7)
    ref, c = _HalvedOneByOne(40), ReuseCounts(40)
    universe = [("k", i) for i in range(60)]
    for step in range(3000):
        keys = rnd.sample(universe, rnd.randint(1, 12))
        weight = rnd.choice((1, 2, 3))
        ref.add(keys, weight)
        if step % 2:
            c.add(keys, weight)
        else:
            c.add_distinct(keys, weight)
        assert c.many(universe) == [ref.counts.get(k, 0) for k in universe], step
        assert [k for k in c._counts if c[k]] == list(ref.counts), step
    assert c.halvings > 2 * _RESCALE


def test_a_tier_halves_its_filings_bucket_by_bucket() -> None:
    """Each key filed under its count halved; the lower counts of a merged bucket first,
    each in its own order (least recently used first)."""
    tr = CountTier(100)
    for k, c in (("a", 3), ("b", 2), ("c", 3), ("d", 1), ("e", 0), ("f", 2), ("g", 5)):
        tr.file(k, c)
    tr.halve()
    assert tr.at == {"a": 1, "b": 1, "c": 1, "d": 0, "e": 0, "f": 1, "g": 2}
    assert list(tr.order()) == ["e", "d", "b", "f", "a", "c", "g"]


def test_a_tier_that_missed_halvings_halves_its_filings_for_each() -> None:
    """A policy that reads counts another counts (the counts' ghost plays only the
    lookups that name no session) may see several halvings at once: its filings are
    halved as many times (refiling every key under its count did that by itself)."""
    a = FrequencyPolicy(FOUR)  # period: 20 capacities of 1-byte blocks, 80 keys
    b = FrequencyPolicy(FOUR)
    mine = [("m", j) for j in range(4)]
    for _ in range(12):
        a.on_request(req(mine), 0.0)
    b.on_counted(req(mine), a.counted)
    for k in mine:
        b.on_insert(BlockInfo(k, B), "dram", 0.0)
    assert [b._t["dram"].at[k] for k in mine] == [12] * 4
    counts = a.counts
    assert counts is not None and counts.halvings == 0
    for i in range(40):  # 160 other keys: two halvings b does not see
        a.on_request(req([("o", i, j) for j in range(4)]), 0.0)
    assert counts.halvings == 2
    b.on_counted(req([("x", 0)]), a.counted)
    assert [b._t["dram"].at[k] for k in mine] == [counts[k] for k in mine] == [3] * 4


def test_halving_keeps_the_counts_order_and_forgets_the_ones() -> None:
    c = ReuseCounts(period=10)
    c.add(["a", "b", "c"])
    c.add(["c", "a"])
    c.add(["d", "a"])
    c.add(["a"], weight=3)  # 10 counted: halved
    assert c.halvings == 1
    assert [(k, c[k]) for k in c._counts if c[k]] == [("c", 1), ("a", 2)]


def req(keys: list[int], hits: list[str | None] | None = None, session: object = "",
        named: bool = False) -> RequestInfo:
    return RequestInfo(keys, hits or [None] * len(keys), session, "chat", B, 512, 512,
                       session_named=named)


def store(pol: Policy, r: RequestInfo, now: float = 0.0) -> dict[object, str]:
    """Look ``r`` up and store what the plan admits, as the engine would (evicting the
    policy's victims for room, children first not needed here: one-block chains)."""
    plan = pol.on_request(r, now)
    for j in range(len(r.keys) - 1, -1, -1):
        k = r.keys[j]
        tier = plan.admit.get(k)
        if tier is None:
            continue
        used = held(pol, tier)
        if len(used) >= 4:
            victim = next(v for v in pol.victims(tier, set(r.keys), now)
                          if v in used and v not in r.keys)
            pol.on_remove(victim, tier)
        pol.on_insert(r.info(j), tier, now)
    if plan.admit:  # (the store ends: the adaptive policy's ghosts store it too)
        pol.on_stored([k for k in r.keys if k in plan.admit], now)
    return dict(plan.admit)


def held(pol: Policy, tier: str) -> set[object]:
    return set(pol.victims(tier, (), 0.0))


def test_a_block_seen_less_often_than_what_it_would_push_out_bypasses() -> None:
    """Four blocks looked up twice fill the tier; a newcomer seen once is refused (and
    so is the rest of its chain: its children could never be served), one seen three
    times takes the place of the least often seen, least recently used block."""
    pol = FrequencyPolicy(FOUR)
    for k in (1, 2, 3, 4):
        pol.on_request(req([k]), 0.0)
    for k in (1, 2, 3, 4):
        store(pol, req([k]))
    assert held(pol, "dram") == {1, 2, 3, 4}
    assert store(pol, req([9, 10])) == {}  # 9 seen once < 2: refused, and 10 with it
    pol.on_request(req([9]), 1.0)
    pol.on_request(req([9]), 2.0)
    assert store(pol, req([9])) == {9: "dram"}  # 9 seen 4 times > 2
    assert held(pol, "dram") == {2, 3, 4, 9}
    assert list(pol.victims("dram", (), 3.0))[:3] == [2, 3, 4]  # lowest count, LRU first


def test_a_partial_last_block_is_never_stored() -> None:
    pol = FrequencyPolicy(FOUR)
    r = RequestInfo([1, 2], [None, None], "", "chat", B, 512, 100, session_named=False)
    assert pol.on_request(r, 0.0).admit == {1: "dram"}


def test_the_guard_bets_on_counts_where_no_session_is_named_and_counting_wins() -> None:
    """Sessionless requests cycling over three popular blocks and two one-off ones, a
    tier of four: LRU hits nothing (five blocks in a cycle), the counts keep the three
    popular ones; their ghost out-hits the LRU ghost, and the guarded policy bets on them
    (it refuses the one-off blocks). With every block reused right after its first use
    (recency is all there is) the ghost does not win and LRU places the blocks (the
    workload bets on inferred sessions are not used: they lost to LRU on most generated
    sessionless kinds); named sessions get the workload bets once their ghost has shown
    a gain (LRU until then), never the counts."""
    pol = AdaptivePolicy(FOUR)
    for r in range(20):
        for k in (1, 2, 3, 100 + 2 * r, 101 + 2 * r):
            store(pol, req([k]), float(r))
    assert pol.count_advantage > 0 and pol._bettor is pol.freq
    assert held(pol, "dram") >= {1, 2, 3}
    assert store(pol, req([999]), 21.0) == {}
    recent = AdaptivePolicy(FOUR)
    for k in range(100):
        store(recent, req([k]), float(k))
        store(recent, req([k]), float(k))
    assert recent.count_advantage <= 0 and recent._bettor is recent.lru
    named = AdaptivePolicy(FOUR)
    for i in range(64):
        named.on_request(req([100 + i], session=f"s{i}", named=True), float(i))
    assert named._bettor is (named.bets if named.proven else named.lru)
    named.proven = True  # (what proves them: tests/policies/test_adaptive.py)
    named.on_request(req([999], session="s", named=True), 65.0)
    assert named._bettor is named.bets


def test_the_counts_lead_only_by_a_share_of_the_tier() -> None:
    """The same cycle as above, where the counts' ghost leads by about 29 blocks: with
    ``counts_share`` asking for a lead of more than that share of the tier (8 x 4 = 32
    blocks), LRU places the blocks although the lead passes ``counts_lead`` allowances
    (a loose tier: a small lead there is within what a hand-over of the tier costs)."""
    for share, bettor in ((0.03, "freq"), (8.0, "lru")):
        pol = AdaptivePolicy(FOUR, counts_share=share)
        for r in range(20):
            for k in (1, 2, 3, 100 + 2 * r, 101 + 2 * r):
                store(pol, req([k]), float(r))
        assert pol.count_advantage > pol.counts_lead * pol.allowance()
        assert pol._bettor is getattr(pol, bettor)
    with pytest.raises(ValueError):
        AdaptivePolicy(FOUR, counts_share=-0.1)
