"""The guarded workload policy, the HBM keep the hints decide, and the baselines
issue 24 asks for (vLLM's native offloading, the tool-call TTL rule fixed)."""

from __future__ import annotations

from kvstore.policies import create
from kvstore.policies.adaptive import AdaptivePolicy, LRUGhost
from kvstore.policies.base import BlockInfo, Hint, Policy, RequestInfo, TierSpec
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


def keep(pol: Policy, session: str, now: float, then: str, tool: str = "") -> float:
    return pol.on_request(look([7, 8], session, then, tool), now).keep_s


def test_the_hint_decides_the_keep_before_anything_is_learned() -> None:
    """A tool call is held in the engine for the bound, a user turn is not: on the old
    code both were 0 until eight waits of the class had been seen."""
    for pol in (WorkloadPolicy(ONE, hbm_keep_max_s=10.0), AdaptivePolicy(ONE)):
        assert keep(pol, "a", 0.0, "tool_call", "grep") == 10.0
        assert keep(pol, "b", 0.0, "turn_end") == 0.0
        assert keep(pol, "c", 0.0, "session_end") == 0.0
        assert keep(pol, "d", 0.0, "") == 0.0


def test_the_keep_follows_what_each_tool_took() -> None:
    """Per tool, learned online: a tool whose calls came back in a minute is not held
    (offload), one that came back in two seconds is held about that long."""
    pol = WorkloadPolicy(ONE, hbm_keep_max_s=10.0)
    now = 0.0
    for i in range(12):
        for tool, gap in (("build", 60.0), ("grep", 2.0)):
            s = f"{tool}{i}"
            pol.on_request(look([100 + i], s, "tool_call", tool), now)
            pol.on_hint(Hint(s, "tool_call", "agent", tool), [], now)
            pol.on_request(look([100 + i], s), now + gap)
        now += 100.0
    assert keep(pol, "new1", now, "tool_call", "build") == 0.0
    held = keep(pol, "new2", now, "tool_call", "grep")
    assert 2.0 <= held <= 10.0, held


def test_the_keep_comes_from_the_hints_whoever_leads() -> None:
    pol = AdaptivePolicy(ONE)
    pol.leader = "lru"
    assert keep(pol, "a", 0.0, "tool_call", "grep") == 10.0
    assert keep(pol, "b", 0.0, "turn_end") == 0.0


def test_the_lru_ghost_scores_what_lru_would_hit() -> None:
    ghost = LRUGhost(3)
    assert ghost.request([1, 2], 1) == 0
    assert ghost.request([1, 2, 3], 1) == 2
    assert ghost.request([4], 1) == 0  # evicts 3, the least recently used
    assert ghost.request([1, 2, 3], 1) == 2 and ghost.used == 3


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
