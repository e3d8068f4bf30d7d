"""The guarded workload policy, the HBM keep the hints decide, and the baselines
issue 24 asks for (vLLM's native offloading, the tool-call TTL rule fixed)."""

from __future__ import annotations

from kvstore.policies import create
from kvstore.policies.adaptive import AdaptivePolicy, LRUGhost
from kvstore.policies.base import BlockInfo, Hint, Policy, RequestInfo, TierSpec, ghost_victims
from kvstore.policies.shadow import Retained
from kvstore.policies.ttl import TTLPolicy
from kvstore.policies.vllm_native import ARCPolicy
from kvstore.policies.workload import WorkloadPolicy

from kvstore.engine.eviction import EvictionManager

B = 1
ONE = [TierSpec("hbm", 10 * B, 1e13)]
TWO = [TierSpec("hbm", 4 * B, 1e13), TierSpec("dram", 40 * B, 25e9)]


def look(keys: list[int], session: str, then: str = "", tool: str = "") -> RequestInfo:
    return RequestInfo(keys, [None] * len(keys), session, "agent", B, 512, 512,
                       then=then, tool=tool)


TINY = [TierSpec("dram", 1 * B, 20e9)]  # no room for a request of three blocks


def look3(session: str, then: str = "", tool: str = "") -> RequestInfo:
    return look([7, 8, 9], session, then, tool)


def test_before_anything_is_learned_a_tool_call_is_kept_where_the_sidecar_cannot() -> None:
    """A tool call whose prefix the sidecar will hold in a fast tier is not kept (a
    return loads it in ~3% of its prefill: the engine's memory is worth more to the
    others); one it has no room for is held for the bound. A user turn, a session end
    and an unknown end are never held before anything is learned. On the old code
    every tool call was held for the bound."""
    for tiers in (ONE, TINY):
        for pol in (WorkloadPolicy(tiers, hbm_keep_max_s=10.0), AdaptivePolicy(tiers)):
            want = 10.0 if tiers is TINY else 0.0
            assert pol.on_request(look3("a", "tool_call", "grep"), 0.0).keep_s == want
            assert pol.on_request(look3("b", "turn_end"), 0.0).keep_s == 0.0
            assert pol.on_request(look3("c", "session_end"), 0.0).keep_s == 0.0
            assert pol.on_request(look3("d", ""), 0.0).keep_s == 0.0


def back(pol: Policy, session: str, keys: list[int], tiers: list[str | None], now: float
         ) -> None:
    pol.on_request(RequestInfo(keys, tiers, session, "agent", B, 512, 512), now)


def test_a_keep_is_asked_only_where_it_paid() -> None:
    """Learned per tool from every return, held or not: "grep" sessions are back in 2 s
    and the sidecar has none of their prefix (a keep pays: held); "cat" sessions are
    back in 2 s too but the sidecar serves their whole prefix from DRAM (a keep gains
    ~3%: not held); "build" sessions are back in a minute (after any keep: not held).
    On the old code "cat" was held (keeps followed the return times only)."""
    pol = WorkloadPolicy(TINY, hbm_keep_max_s=10.0)
    now = 0.0
    for i in range(12):
        for tool, gap, served in (("grep", 2.0, None), ("cat", 2.0, "dram"),
                                  ("build", 60.0, None)):
            s = f"{tool}{i}"
            keys = [1000 * i + k for k in (1, 2, 3)]
            pol.on_request(RequestInfo(keys, [None] * 3, s, "agent", B, 512, 512,
                                       then="tool_call", tool=tool), now)
            pol.on_hint(Hint(s, "tool_call", "agent", tool), [], now)
            back(pol, s, [*keys, 5], [served] * 3 + [None], now + gap)
        now += 100.0
    assert pol.on_request(look3("new1", "tool_call", "grep"), now).keep_s >= 2.0
    assert pol.on_request(look3("new2", "tool_call", "cat"), now).keep_s == 0.0
    assert pol.on_request(look3("new3", "tool_call", "build"), now).keep_s == 0.0
    assert pol.holds.gain(("agent", "tool", "grep")) == 1.0
    assert pol.holds.gain(("agent", "tool", "cat")) < 0.1


def test_a_return_that_asks_for_another_prefix_gains_nothing() -> None:
    """Chained hashes: a next request whose block at the held length differs did not
    reuse the held prefix, so the keep would have gained nothing."""
    pol = WorkloadPolicy(TINY, hbm_keep_max_s=10.0)
    for i in range(8):
        s = f"s{i}"
        pol.on_request(RequestInfo([1, 2, 3 + 10 * i], [None] * 3, s, "agent", B, 512, 512,
                                   then="tool_call", tool="grep"), 0.0)
        back(pol, s, [1, 2, 4 + 10 * i], [None] * 3, 1.0)
    assert pol.on_request(look3("new", "tool_call", "grep"), 2.0).keep_s == 0.0
    assert pol.holds.gain(("agent", "tool", "grep")) == 0.0


def test_the_keep_comes_from_the_hints_whoever_leads() -> None:
    pol = AdaptivePolicy(TINY)
    pol.leader = "lru"
    assert pol.on_request(look3("a", "tool_call", "grep"), 0.0).keep_s == 10.0
    assert pol.on_request(look3("b", "turn_end"), 0.0).keep_s == 0.0


def test_the_lru_ghost_scores_what_lru_would_hit() -> None:
    ghost = LRUGhost(3)
    assert ghost.request([1, 2], 1) == 0
    assert ghost.request([1, 2, 3], 1) == 2
    assert ghost.request([4], 1) == 0  # evicts 3, the least recently used
    assert ghost.request([1, 2, 3], 1) == 2 and ghost.used == 3


def test_the_lru_ghost_evicts_as_the_engine_does_children_first() -> None:
    """A prompt's decode blocks reach the ghost as a request of their own (their first
    block's parent unknown); the stores tell whose children they are. Under pressure
    the engine then takes the decode blocks, the chain's leaves, before the prompt
    (LRU's oldest, but their ancestor), and so does the ghost: the prompt stays whole
    and the next turn hits it and what is left of its output."""
    pol = AdaptivePolicy([TierSpec("dram", 5)])
    pol.on_request(RequestInfo([1, 2, 3], [None] * 3, "s", "chat", 1, 16, 16), 0.0)
    ghost = pol._ghost
    assert ghost is not None
    assert list(ghost.keys) == []  # (the ghosts store when the engine does)
    pol.on_stored([1, 2, 3], 0.5)
    pol.on_request(RequestInfo([4, 5], [None] * 2, "s", "chat", 1, 16, 16,
                               continues=[1, 2, 3]), 1.0)  # decode
    # their store: the engine says whose children they are before its store ends
    pol.on_insert_many([BlockInfo(4, 1, 3), BlockInfo(5, 1, 4)], "dram", 1.0)
    pol.on_stored([4, 5], 1.0)
    assert list(ghost.keys) == [3, 2, 1, 5, 4]  # (oldest first: 3, the prompt's last)
    ghost.request([9], 1, 2.0)  # one must go: 3's subtree gives its deepest leaf, 5
    assert list(ghost.keys) == [3, 2, 1, 4, 9]
    assert ghost.request([1, 2, 3, 4, 5], 1, 3.0) == 4
    bare = LRUGhost(5)  # (without the stores' parents: the prompt's tail went)
    bare.request([1, 2, 3], 1)
    bare.request([4, 5], 1)
    bare.request([9], 1)
    assert bare.request([1, 2, 3, 4, 5], 1) == 2


def test_ttl_sends_a_block_it_refuses_from_the_top_tier_to_the_next() -> None:
    """The fixed rule: a held session fills the top tier, a new request's blocks
    bypass it and enter DRAM instead of being dropped (before: not admitted at all)."""
    pol = TTLPolicy(TWO)
    for i in range(4):
        pol.on_insert(BlockInfo(i, B, i - 1 if i else None, "held"), "hbm", 0.0)
    pol.on_hint(Hint("held", "tool_call"), [(i, "hbm") for i in range(4)], 0.0)
    plan = pol.on_request(RequestInfo([10, 11], [None, None], "new", "agent", B, 512, 512),
                          1.0)
    assert dict(plan.admit) == {10: "dram", 11: "dram"}
    alone = TTLPolicy(TWO[:1])  # one tier: nowhere lower, refused as before
    for i in range(4):
        alone.on_insert(BlockInfo(i, B, i - 1 if i else None, "held"), "hbm", 0.0)
    alone.on_hint(Hint("held", "tool_call"), [(i, "hbm") for i in range(4)], 0.0)
    assert not alone.on_request(RequestInfo([10], [None], "new", "agent", B, 512, 512),
                                1.0).admit


def test_vllm_native_stores_a_block_on_its_second_sighting() -> None:
    for name in ("vllm-lru", "vllm-arc"):
        pol = create(name, ONE)
        req = RequestInfo([1, 2], [None, None], "s", "chat", B, 512, 512)
        assert not pol.on_request(req, 0.0).admit, name
        assert dict(pol.on_request(req, 1.0).admit) == {1: "hbm", 2: "hbm"}, name


def test_arc_moves_its_target_on_ghost_hits_and_evicts_from_t1_first() -> None:
    pol = ARCPolicy([TierSpec("hbm", 4 * B)])
    managed = EvictionManager(pol)  # the engine's view: victims read through it
    for k in range(4):
        managed.on_insert(BlockInfo(k, B), "hbm", 0.0)
    pol.on_access(2, "hbm", 0.0)  # the engine touches what it just stored: still T1
    assert 2 in pol._t["hbm"].t1
    pol.on_request(RequestInfo([3], ["hbm"], "s", "chat", B, 512, 512), 1.0)
    pol.on_access(3, "hbm", 1.0)  # a second use: 3 is in T2 now
    assert 3 in pol._t["hbm"].t2
    assert managed.evict("hbm", B, set(), 2.0) == [0]  # T1's oldest
    managed.on_remove(0, "hbm")  # the engine removes the victim: it goes to B1
    arc = pol._t["hbm"]
    assert 0 in arc.b1 and arc.target == 0.0
    pol.on_request(RequestInfo([0], [None], "s", "chat", B, 512, 512), 3.0)
    assert arc.target == 1.0  # a B1 hit: recency deserves more room


DISK = [TierSpec("dram", 2 * B, 20e9), TierSpec("disk", 4 * B, 3e9)]


def fill(pol: Policy, keys: list[int], session: str, now: float, then: str = "",
         tool: str = "") -> dict[object, str]:
    """A lookup of ``keys`` and the store of what its plan admits."""
    admit = dict(pol.on_request(look(keys, session, then, tool), now).admit)
    for k, tier in admit.items():
        pol.on_insert(BlockInfo(k, B, None, session, "agent"), tier, now)
    if admit:  # (the engine's store ends: the policy's ghosts store it too)
        pol.on_stored(list(admit), now)
    return admit


def test_the_floor_keeps_what_lru_keeps() -> None:
    """With a disk below DRAM the disk is the floor: it takes every newcomer the bets
    refuse, every block DRAM lets go (an ended session's too, which the bets drop), and
    evicts oldest first as LRU does, whatever the sessions are worth to the bets. On the
    old code the guarded policy refused the newcomer, dropped the ended session's block
    and evicted the disk by session value (the disk-20,000 served runs of issue 24
    lost hit rate to LRU from those disk evictions)."""
    bets, pol = WorkloadPolicy(DISK), AdaptivePolicy(DISK)
    for p in (bets, pol):  # "v" fills both tiers and is back at once: worth the most
        fill(p, [1, 2, 3, 4, 5, 6], "v", 0.0, "tool_call", "grep")
        p.on_hint(Hint("v", "tool_result", "agent"), [(1, "dram"), (3, "disk")], 1.0)
    assert fill(bets, [11, 12], "n", 2.0) == {}  # the bets refuse the newcomer
    assert fill(pol, [11, 12], "n", 2.0) == {11: "disk", 12: "disk"}
    pol.on_remove(1, "dram")  # room in DRAM for the ended session's block
    assert fill(pol, [21], "e", 3.0) == {21: "dram"}
    pol.on_hint(Hint("e", "session_end", "agent"), [(21, "dram")], 4.0)
    assert pol.bets.demote_to(21, "dram", 5.0) is None  # worth nothing to the bets
    assert pol.demote_to(21, "dram", 5.0) == "disk"
    # the disk's order is LRU's: v's blocks (stored first) before the newcomer's
    assert list(pol.victims("disk", (), 5.0))[:4] == [3, 4, 5, 6]
    assert next(iter(pol.bets.victims("disk", (), 5.0))) in (11, 12)
    assert pol.floor == "disk" and AdaptivePolicy(ONE).floor is None


def test_the_ghost_counts_lrus_misses_for_want_of_room() -> None:
    """``lost``: the keys of a request LRU had evicted (it would have hit them with
    more room), not those it never saw; the evicted list is bounded by the capacity."""
    ghost = LRUGhost(2)
    ghost.request([1, 2], 1)
    ghost.request([3, 4], 1)  # evicts 2, then 1
    assert ghost.lost == 0 and list(ghost.gone) == [2, 1]
    ghost.request([1, 9], 1)  # 1 was evicted, 9 never seen
    assert ghost.lost == 1
    ghost.request([5, 6, 7, 8], 1)
    assert ghost.gone_used <= 2 and 2 not in ghost.gone


def test_the_ghosts_play_the_engines_retention_shield() -> None:
    """A retained key (its deadline after now) is passed over while the shielded bytes
    stay within half the ghost's capacity (the engine's default retention quota, granted
    in the order retained), taken only when nothing else can go (the oldest deadline
    first), and an ordinary key again past its deadline."""
    kept = Retained()
    ghost = LRUGhost(4, kept)
    ghost.request([1, 2, 3, 4], 1, 0.0)  # (the first block ends most recent: 4 3 2 1)
    kept.add([1, 2, 3], 100.0, 0.0)  # 1 and 2 within the quota of 2 blocks; 3 is not
    kept.add([2], 150.0, 0.5)  # extended: 2's deadline is now the later one
    ghost.request([5], 1, 1.0)
    assert list(ghost.keys) == [3, 2, 1, 5]  # 4 went, LRU's least recent
    ghost.request([6, 7], 1, 2.0)  # 3 and 5 go; 1 and 2 stay, the oldest of all
    assert list(ghost.keys) == [2, 1, 7, 6]
    kept.add([6], 60.0, 2.0)  # past the quota: not shielded
    ghost.request([8, 9, 10], 1, 3.0)  # 7 and 6, then (nothing else) the oldest deadline
    assert list(ghost.keys) == [2, 10, 9, 8]
    ghost.request([11, 12, 13], 1, 200.0)  # past the deadlines: LRU's order again
    assert list(ghost.keys) == [8, 13, 12, 11] and not kept  # (the expired forgotten)
    # ghost_victims (the counts' and the bets' ghosts): the same shield on their order
    sizes = dict.fromkeys(range(6), 1)
    shield = {0: 30.0, 1: 20.0, 2: 20.0}  # key -> deadline, in the order retained
    assert ghost_victims(range(6), {5}, sizes, 2, shield) == [3, 4]
    assert ghost_victims(range(6), {5}, sizes, 4, shield) == [3, 4, 2, 1]
    assert ghost_victims(range(6), (), sizes, 2) == [0, 1]
    assert Retained().shield(sizes, 6, 0.0) == {}
    quota = Retained()
    quota.add([0, 1, 2, 3], 10.0, 0.0)
    assert list(quota.shield(sizes, 6, 0.0)) == [0, 1, 2]  # 3 blocks of 6: the quota
    assert list(quota.shield({1: 1, 3: 1}, 6, 0.0)) == [1, 3]  # only what the ghost holds


def test_the_floor_is_the_bets_where_lru_loses_for_want_of_room() -> None:
    """A scan over 1.5 times the tiers' room, twice: LRU misses every key the second
    time for want of room, so the floor stops following LRU (its order is the bets')."""
    pol = AdaptivePolicy(DISK)
    for rnd in range(2):
        for i in range(9):
            fill(pol, [100 + i], f"s{i}", rnd * 100.0 + i)
    assert pol.floor == "disk" and not pol.floor_lru
    order = list(pol.victims("disk", (), 300.0))
    assert order == list(pol.bets.victims("disk", (), 300.0))
    assert order != list(pol.lru.victims("disk", (), 300.0))


def test_a_link_learned_before_its_block_waits_for_it() -> None:
    """A ghost waiting for the engine's store adds a request's decode blocks after the
    engine said whose children they are: the link is kept until the block comes."""
    from kvstore.policies.children import ChildIndex

    idx = ChildIndex()
    idx.add(1, None, 1)
    idx.link(2, 1)  # (2 not held yet)
    assert not idx.has_children(1)
    idx.add(2, None, 1)
    assert idx.has_children(1)
    assert idx.take([1, 2], 1, ()) == [2]  # the child goes first


def test_the_ghosts_store_when_the_engine_does() -> None:
    """The ghosts play a lookup at once but store its blocks when the engine does (the
    end of its prefill: ``on_stored``), or when a hint ends its request; where the
    engine stores nothing (every block held), at once."""
    pol = AdaptivePolicy([TierSpec("dram", 10)])
    pol.on_request(RequestInfo([1, 2, 3], [None] * 3, "s", "chat", 1, 16, 16,
                               request_id="a"), 0.0)
    ghost = pol._ghost
    assert ghost is not None and list(ghost.keys) == []
    pol.on_request(RequestInfo([7, 8], [None] * 2, "t", "chat", 1, 16, 16,
                               request_id="b"), 0.5)
    pol.on_stored([1, 2, 3], 1.0)  # a's store (b's waits)
    assert list(ghost.keys) == [3, 2, 1]
    pol.on_hint(Hint("t", "turn_end", request_id="b"), [], 2.0)  # b ends, unstored
    assert list(ghost.keys) == [3, 2, 1, 8, 7]
    # every block held by the engine: nothing for it to store, the ghost stores now
    pol.on_request(RequestInfo([4], ["dram"], "u", "chat", 1, 16, 16, request_id="c"), 3.0)
    assert 4 in ghost.keys
    # a decode store keeps the chain it continues
    full = AdaptivePolicy([TierSpec("dram", 4)])
    full.on_request(RequestInfo([1, 2, 3], [None] * 3, "s", "chat", 1, 16, 16), 0.0)
    full.on_stored([1, 2, 3], 0.0)
    g = full._ghost
    assert g is not None
    full.on_request(RequestInfo([5, 6], [None] * 2, "s", "chat", 1, 16, 16,
                                continues=[1, 2, 3]), 1.0)
    full.on_stored([5, 6], 1.0)
    assert set(g.keys) == {1, 2, 3, 5}  # (its own tail cut, the prompt kept)


def test_the_bets_hand_named_sessions_back_once_lrus_lead_is_proven() -> None:
    """Two-way proof: proven bets place named sessions' blocks until LRU's lead over
    their real hits is proven (``prove_back`` standard deviations of the paired
    per-request difference), not on the first request that LRU would have hit more."""
    pol = AdaptivePolicy([TierSpec("dram", 8)])
    pol.proven = True  # (as if their ghost had shown a gain)
    keys = [1, 2, 3, 4]

    def lookup(now: float) -> None:  # the real tiers miss what the LRU ghost holds
        pol.on_request(RequestInfo(keys, [None] * 4, "s", "chat", 1, 16, 16), now)
        pol.on_stored(keys, now)

    lookup(0.0)
    lost = 0
    while pol.proven and lost < 10:
        lost += 1
        lookup(float(lost))
    assert not pol.proven and pol.handbacks == 1
    assert lost == 3  # -12 blocks against 1.5 * sqrt(3 * 16): proven (-8 at two was not)
    assert pol._bettor is pol.lru or pol.leader == "bets"


def test_the_bets_gain_is_proven_from_their_ghosts_lowest_point() -> None:
    """The evidence that puts the bets back counts their gain from their ghost's lowest
    point: a losing phase does not carry its deficit into a later gain, though its
    spread still counts. (Carried, as before, 50 requests 4 blocks behind needed 73
    requests 4 blocks ahead, not 17.)"""
    pol = AdaptivePolicy([TierSpec("dram", 10_000)])
    pol._mean_n = 4.0  # (named requests of four blocks)
    for _ in range(50):  # the ghost 4 blocks behind LRU's, request after request
        assert not pol._shows(-4.0, -1.0)
    assert pol.shown == pol._shown_pb == 0.0  # (no deficit)
    assert pol.shown_swing == 800.0 and pol._shown_pb_swing == 50.0  # (the spread counts)
    ahead = 1
    while not pol._shows(4.0, 1.0):  # then 4 blocks ahead
        ahead += 1
    assert ahead == 17  # 68 blocks against 2 * sqrt(50 * 16 + 17 * 16) = 65.5
    # a dip that stays above the lowest point is evidence like any other
    pol = AdaptivePolicy([TierSpec("dram", 10_000)])
    pol._mean_n = 4.0
    for s in (4.0, 4.0, -4.0):
        assert not pol._shows(s, s / 4)
    assert pol.shown == 4.0 and pol.shown_swing == 48.0


def test_a_client_that_says_its_session_waits_on_a_tool_proves_the_bets_first() -> None:
    """The first lookup whose client says the turn ends in a tool call (``then``) is
    the bets' first proof: the traffic they were built for. Any other named lookup
    leaves LRU placing until their ghost shows a gain, and after a hand-back the
    statement proves nothing again (the ghost must)."""
    chat = AdaptivePolicy([TierSpec("dram", 8)])
    chat.on_request(RequestInfo([1, 2], [None] * 2, "s", "chat", 1, 16, 16,
                                then="turn_end"), 0.0)
    assert not chat.proven and chat.proofs == 0
    pol = AdaptivePolicy([TierSpec("dram", 8)])
    pol.on_request(RequestInfo([1, 2], [None] * 2, "s", "agent", 1, 16, 16,
                               then="tool_call", tool="bash"), 0.0)
    assert pol.proven and pol.proofs == 1
    pol.proven = False  # (as after a hand-back)
    pol.on_request(RequestInfo([1, 2, 3], [None] * 3, "s", "agent", 1, 16, 16,
                               then="tool_call", tool="bash"), 1.0)
    assert not pol.proven and pol.proofs == 1
    # two tiers worth loading from: proven from the start, the statement changes nothing
    two = AdaptivePolicy([TierSpec("dram", 8), TierSpec("disk", 64)])
    two.on_request(RequestInfo([1, 2], [None] * 2, "s", "agent", 1, 16, 16,
                               then="tool_call", tool="bash"), 0.0)
    assert two.proven and two.proofs == 0


def test_the_guards_window_counts_bytes_looked_up_whatever_block_size_came_first() -> None:
    """The guard's score window is traffic, counted in bytes: a first lookup of 1 MiB
    blocks does not size it for the 4 KiB lookups after it (in the first lookup's
    blocks, a 4,000 KiB tier was a window of 16 x 3 blocks, closed by every lookup)."""
    kib4, mib = 4096, 1 << 20
    pol = AdaptivePolicy([TierSpec("dram", 1000 * kib4, 20e9)])
    pol.on_request(RequestInfo(["big"], [None], "", "chat", mib, 16, 16), 0.0)
    assert pol._span == pol.window * 1000 * kib4
    left = pol._left
    keys = [("small", j) for j in range(100)]
    pol.on_request(RequestInfo(keys, [None] * 100, "", "chat", kib4, 16, 16), 1.0)
    assert left - pol._left == 100 * kib4


def test_the_guards_score_counts_hit_bytes_whatever_block_size_came_first() -> None:
    """The score is hit bytes, in blocks of the first lookup's size: 100 hits of 4 KiB
    blocks that LRU's ghost misses add 100 x 4 KiB / 1 MiB to it, not 100 (the bank of
    a 1 MiB namespace spent on a few KiB of another's)."""
    kib4, mib = 4096, 1 << 20
    pol = AdaptivePolicy([TierSpec("dram", 4000 * kib4, 20e9)])
    pol.on_request(RequestInfo(["big"], [None], "", "chat", mib, 16, 16), 0.0)
    assert pol.advantage == 0 and pol.swing == 0
    keys = [("small", j) for j in range(100)]  # held by the tier, not by LRU's ghost
    pol.on_request(RequestInfo(keys, ["dram"] * 100, "", "chat", kib4, 16, 16), 1.0)
    assert pol.advantage == 100 * kib4 / mib
    assert pol.swing == (100 * kib4 / mib) ** 2
