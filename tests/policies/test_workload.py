"""Behaviour of the workload-aware policy beyond the shared suite (its evictions as the
engine's eviction manager takes them)."""

from __future__ import annotations

from kvstore.policies.base import BlockInfo, Hint, RequestInfo, TierSpec
from kvstore.policies.workload import WorkloadPolicy

from kvstore.engine.eviction import EvictionManager

B = 1
ONE = [TierSpec("hbm", 10 * B, 1e13)]
THREE = [TierSpec("hbm", 10 * B, 1e13), TierSpec("dram", 40 * B, 25e9),
         TierSpec("disk", 100 * B, 3e9)]


def request(pol: WorkloadPolicy | EvictionManager, keys: list[int], session: str, now: float,
            workload: str = "agent", last_tokens: int = 512, store: bool = True
            ) -> dict[object, str]:
    """One request: the policy's plan, then its admitted blocks stored (tail first)."""
    inner = pol.inner if isinstance(pol, EvictionManager) else pol
    assert isinstance(inner, WorkloadPolicy)
    hit = [next((t for t, tr in inner._t.items() if k in tr), None) for k in keys]
    plan = pol.on_request(RequestInfo(keys, hit, session, workload, B, 512, last_tokens), now)
    if store:
        for j in range(len(keys) - 1, -1, -1):
            tier = plan.admit.get(keys[j])
            if tier is not None:
                pol.on_insert(BlockInfo(keys[j], B, keys[j - 1] if j else None, session,
                                        workload, 512), tier, now)
    return dict(plan.admit)


def train(pol: WorkloadPolicy | EvictionManager, rounds: int = 30) -> float:
    """Agent sessions: after a tool call they are back in 10 s, after a user turn in
    30 min. Returns the time reached."""
    now = 0.0
    for r in range(rounds):
        s = f"train{r}"
        request(pol, [10_000 + r], s, now, store=False)
        pol.on_hint(Hint(s, "tool_call", "agent"), [], now)
        now += 10.0
        request(pol, [10_000 + r], s, now, store=False)
        pol.on_hint(Hint(s, "turn_end", "agent"), [], now)
        request(pol, [10_000 + r], s, now + 1800.0, store=False)
        pol.on_hint(Hint(s, "session_end", "agent"), [], now + 1800.0)
    return now + 2000.0


def test_a_session_waiting_on_a_tool_outlives_one_waiting_on_its_user() -> None:
    pol = EvictionManager(WorkloadPolicy(ONE))
    now = train(pol)
    request(pol, [1, 2, 3, 4, 5], "tool", now)
    pol.on_hint(Hint("tool", "tool_call", "agent"), [], now)
    request(pol, [11, 12, 13, 14, 15], "user", now + 1)
    pol.on_hint(Hint("user", "turn_end", "agent"), [], now + 1)
    victims = pol.evict("hbm", 3 * B, set(), now + 2)
    assert victims == [15, 14, 13], "the user-waiting session goes first, tail first"


def test_a_newcomer_bypasses_a_more_valuable_incumbent() -> None:
    """Two agents alternating would evict each other turn after turn; the newcomer
    whose blocks would push out a session just gone to a tool is refused instead."""
    pol = WorkloadPolicy(ONE)
    now = train(pol)
    request(pol, list(range(1, 11)), "a", now)  # fills the tier
    pol.on_hint(Hint("a", "tool_call", "agent"), [], now)
    admitted = request(pol, list(range(21, 31)), "b", now + 1)
    assert admitted == {}, "b would evict a fresh tool wait: it bypasses the tier"
    # A session that ended is worth nothing: its room goes to the next newcomer.
    pol.on_hint(Hint("a", "session_end", "agent"), [], now + 2)
    assert len(request(pol, list(range(31, 41)), "c", now + 3, store=False)) == 10


def test_a_partial_last_block_is_never_stored() -> None:
    pol = WorkloadPolicy(ONE)
    admitted = request(pol, [1, 2, 3], "s", 0.0, last_tokens=100)
    assert set(admitted) == {1, 2}


def test_an_ended_session_goes_first_and_back_hints_prefetch() -> None:
    pol = EvictionManager(WorkloadPolicy(ONE))
    now = train(pol)
    request(pol, [1, 2, 3], "done", now)
    request(pol, [11, 12, 13], "busy", now)
    pol.on_hint(Hint("busy", "tool_call", "agent"), [], now)
    assert pol.on_hint(Hint("done", "session_end", "agent"), [], now) == []
    assert pol.evict("hbm", 3 * B, set(), now + 1) == [3, 2, 1], "worth nothing: first out"
    three = WorkloadPolicy(THREE)
    up = three.on_hint(Hint("t", "tool_result", "agent"), [(5, "disk"), (6, "hbm")], 2.0)
    assert {(m.key, m.src, m.dst) for m in up} == {(5, "disk", "hbm")}


def test_blocks_several_sessions_use_are_pooled_and_outlive_an_ended_session() -> None:
    pol = EvictionManager(WorkloadPolicy(ONE))
    now = train(pol)
    request(pol, [1, 2, 3], "a", now)
    request(pol, [1, 2, 4], "b", now + 1)  # 1, 2: a shared prompt
    pol.on_hint(Hint("b", "session_end", "agent"), [], now + 2)
    pol.on_hint(Hint("a", "session_end", "agent"), [], now + 2)
    victims = pol.evict("hbm", 2 * B, set(), now + 3)
    assert victims is not None and set(victims) == {3, 4}, "private blocks go before the pool"


def test_a_long_user_gap_offloads_from_the_fastest_tier() -> None:
    pol = WorkloadPolicy(THREE, keep_gap_s=30.0)
    request(pol, [1, 5, 6], "a", 0.0)
    moves = pol.on_hint(Hint("a", "turn_end", "chat", expected_gap_s=300.0),
                        [(5, "hbm"), (6, "hbm")], 1.0)
    assert {(m.key, m.src, m.dst) for m in moves} == {(5, "hbm", "dram"), (6, "hbm", "dram")}
    assert pol.on_hint(Hint("a", "tool_call", "agent", tool="search", expected_gap_s=2.0),
                       [(5, "hbm")], 2.0) == []


def test_tool_names_are_bounded() -> None:
    pol = WorkloadPolicy(ONE)
    for i in range(100):
        pol.on_hint(Hint(f"s{i}", "tool_call", "agent", tool=f"tool-{i}"), [], float(i))
    assert len(pol._tools["agent"]) == 32
    assert pol._sessions["s99"].tool == "other"


def test_sessions_are_bounded() -> None:
    pol = WorkloadPolicy(ONE, max_sessions=50)
    for i in range(200):
        request(pol, [i], f"s{i}", float(i), store=False)
    assert len(pol._sessions) == 50


def keep(pol: WorkloadPolicy, session: str, now: float, then: str, tool: str = "",
         gap: float | None = None) -> float:
    """The HBM keep the policy decides at a request's lookup."""
    plan = pol.on_request(RequestInfo([7, 8], [None, None], session, "agent", B, 512, 512,
                                      then=then, tool=tool, expected_gap_s=gap), now)
    return plan.keep_s


def test_hbm_keep_follows_the_clients_gap_within_the_limit() -> None:
    pol = WorkloadPolicy(ONE, hbm_keep_max_s=10.0)
    assert keep(pol, "a", 0.0, "tool_call", "grep", gap=4.0) == 4.0
    assert keep(pol, "b", 0.0, "tool_call", "build", gap=60.0) == 0.0  # too long: offload
    assert keep(pol, "c", 0.0, "turn_end", gap=2.0) == 2.0  # a user who said so
    assert keep(pol, "d", 0.0, "session_end", gap=1.0) == 0.0  # over: drop, never keep
    assert keep(pol, "e", 0.0, "", gap=1.0) == 0.0  # the turn's end is unknown
    assert keep(WorkloadPolicy(ONE, hbm_keep_max_s=0.0), "f", 0.0, "tool_call", gap=1.0) == 0.0


def test_hbm_keep_learned_from_how_soon_the_class_comes_back() -> None:
    """Without a gap from the client: tool calls of this workload came back in 10 s,
    user turns in 30 min. A keep limit of 20 s keeps a tool call until nine in ten of
    those that come back within it are back; 5 s is too short for most of them."""
    pol = WorkloadPolicy(ONE, hbm_keep_max_s=20.0)
    now = train(pol)
    kept = keep(pol, "new", now, "tool_call")
    assert 10.0 <= kept <= 20.0, kept
    assert keep(pol, "new2", now, "turn_end") == 0.0
    # Nothing learned: a tool call is kept only where the sidecar will not hold its
    # prefix (here it has room: not kept; see test_adaptive).
    fresh = WorkloadPolicy(ONE)
    assert keep(fresh, "fresh", 0.0, "tool_call") == 0.0
    assert keep(fresh, "fresh2", 0.0, "turn_end") == 0.0
    short = WorkloadPolicy(ONE, hbm_keep_max_s=5.0)
    now = train(short)
    assert keep(short, "new", now, "tool_call") == 0.0


def test_a_session_in_flight_is_valued_by_the_wait_its_lookup_announced() -> None:
    """Tool calls come back in 10 s, user turns in 30 min. A session whose request is
    in flight and whose lookup said the turn ends in a tool call keeps its blocks over a
    session waiting on its user. On the old code the running session was valued by the
    idle class (no returns of its own: every idle wait is re-classed by the hint at the
    request's end), so its freshly saved blocks went first."""
    pol = EvictionManager(WorkloadPolicy(ONE))
    now = train(pol)
    request(pol, [11, 12, 13, 14, 15], "user", now)
    pol.on_hint(Hint("user", "turn_end", "agent"), [], now)
    inner = pol.inner
    keys = [1, 2, 3, 4, 5]
    plan = pol.on_request(RequestInfo(keys, [None] * 5, "tool", "agent", B, 512, 512,
                                      then="tool_call"), now + 1)
    for j in range(4, -1, -1):
        if keys[j] in plan.admit:
            pol.on_insert(BlockInfo(keys[j], B, keys[j - 1] if j else None, "tool", "agent",
                                    512), plan.admit[keys[j]], now + 1)
    assert isinstance(inner, WorkloadPolicy) and all(k in inner._t["hbm"] for k in keys)
    victims = pol.evict("hbm", 3 * B, set(), now + 5)  # the tool call still running
    assert victims == [15, 14, 13], "the user-waiting session goes first"


def test_a_tool_wait_past_the_hour_is_worth_more_than_an_ended_session() -> None:
    """Tool calls of this workload come back after 75 min (a build, a person approving
    it). A session that has waited 70 min on one is still worth keeping: an ended
    session goes first. (A return-time grid ending at an hour counted those returns as
    never and valued the waiting session at nothing, as the ended one.)"""
    pol = EvictionManager(WorkloadPolicy(ONE))
    now = 0.0
    for r in range(30):
        s = f"train{r}"
        request(pol, [10_000 + r], s, now, store=False)
        pol.on_hint(Hint(s, "tool_call", "agent"), [], now)
        request(pol, [10_000 + r], s, now + 4500.0, store=False)
        now += 10.0
    now += 4500.0
    request(pol, [1, 2, 3, 4, 5], "waiting", now)
    pol.on_hint(Hint("waiting", "tool_call", "agent"), [], now)
    request(pol, [11, 12, 13, 14, 15], "ended", now + 1)
    pol.on_hint(Hint("ended", "session_end", "agent"), [], now + 1)
    later = now + 4200.0
    inner = pol.inner
    assert isinstance(inner, WorkloadPolicy)
    assert inner._value_at("waiting", later) > 0.0
    assert pol.evict("hbm", 3 * B, set(), later) == [15, 14, 13]
