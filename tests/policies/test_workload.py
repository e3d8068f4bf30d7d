"""Behaviour of the workload-aware policy beyond the shared suite."""

from __future__ import annotations

from kvstore.policies.base import BlockInfo, Hint, TierSpec
from kvstore.policies.workload import WorkloadPolicy

B = 100
ONE = [TierSpec("hbm", 50 * B, 1e13)]
THREE = [TierSpec("hbm", 50 * B, 1e13), TierSpec("dram", 100 * B, 25e9),
         TierSpec("disk", 400 * B, 3e9)]


def request(pol: WorkloadPolicy, keys: list[int], session: str, now: float,
            workload: str = "chat", last_tokens: int = 512) -> None:
    info = BlockInfo(keys[-1], B, None, session, workload, last_tokens, len(keys))
    pol.on_lookup(keys, [None] * len(keys), info, now)
    for j in range(len(keys) - 1, -1, -1):
        k = keys[j]
        tokens = last_tokens if j == len(keys) - 1 else 512
        pol.on_insert(BlockInfo(k, B, keys[j - 1] if j else None, session, workload, tokens,
                                len(keys)), "hbm", now)


def test_learns_that_partial_tail_blocks_do_not_return() -> None:
    pol = WorkloadPolicy(ONE)
    nid = 1000
    chains: dict[str, list[int]] = {}
    for turn in range(40):
        s = f"s{turn % 5}"
        chain = chains.get(s, [1, 2])
        chain = [*chain, nid]  # a full block the next turn reuses
        chains[s] = chain
        request(pol, [*chain, nid + 1], s, float(turn), last_tokens=100)  # partial tail
        nid += 2
    full = pol._t["hbm"].meta[chains["s0"][-1]][0]
    tail = pol._t["hbm"].meta[nid - 1][0]
    assert pol.value(tail, 1.0, "hbm") < pol.value(full, 1.0, "hbm")
    victims = pol.evict("hbm", B, set(), 41.0)
    assert victims is not None
    assert pol._t["hbm"].meta[victims[0]][0][2], "the first victim is a partial tail block"


def test_session_end_drops_private_blocks_but_keeps_shared_ones() -> None:
    pol = WorkloadPolicy(THREE)
    request(pol, [1, 2, 10, 11], "a", 0.0)
    request(pol, [1, 2, 20, 21], "b", 1.0)  # 1 and 2 are shared by two sessions
    held = [(k, "hbm") for k in (1, 2, 20, 21)]
    moves = pol.on_hint(Hint("b", "session_end", "chat"), held, 2.0)
    dropped = {m.key for m in moves if m.dst is None}
    assert dropped == {20, 21}


def test_long_expected_gap_offloads_to_a_slower_tier() -> None:
    pol = WorkloadPolicy(THREE, keep_gap_s=30.0)
    request(pol, [1, 5, 6], "a", 0.0)
    moves = pol.on_hint(Hint("a", "turn_end", "chat", expected_gap_s=300.0),
                        [(5, "hbm"), (6, "hbm")], 1.0)
    assert {(m.key, m.src, m.dst) for m in moves} == {(5, "hbm", "dram"), (6, "hbm", "dram")}
    short = pol.on_hint(Hint("a", "tool_call", "agent", tool="search", expected_gap_s=2.0),
                        [(5, "hbm"), (6, "hbm")], 2.0)
    assert short == []


def test_tool_hint_learns_per_tool_return_times() -> None:
    pol = WorkloadPolicy(ONE)
    chain = [1, 2]
    nid = 100
    now = 0.0
    for step in range(30):
        chain = [*chain, nid]
        nid += 1
        request(pol, chain, "agent-1", now, "agent")
        tool = "fast" if step % 2 == 0 else "slow"
        pol.on_hint(Hint("agent-1", "tool_call", "agent", tool=tool),
                    [(k, "hbm") for k in chain], now)
        now += 2.0 if tool == "fast" else 600.0
    fast_gap = pol.expected_gap("agent", "tool_call", "fast")
    slow_gap = pol.expected_gap("agent", "tool_call", "slow")
    assert fast_gap is not None and slow_gap is not None
    assert fast_gap < 10.0 < 300.0 < slow_gap
    assert pol.expected_gap("agent", "tool_call", "never-seen") is None


def test_demotion_skips_a_tier_that_loses_to_recompute() -> None:
    tiers = [TierSpec("hbm", 10 * B, 1e13), TierSpec("remote", 100 * B, 1e6)]
    pol = WorkloadPolicy(tiers)
    request(pol, [1, 2, 3], "a", 0.0)
    assert pol.demote_to(3, "hbm", 1.0) is None
    info = BlockInfo(9, B, None, "a", "chat", 512, 1)
    assert pol.admit(info, 1.0) == "hbm"


def test_a_hint_that_the_session_is_back_prefetches_its_slower_blocks() -> None:
    pol = WorkloadPolicy(THREE, keep_gap_s=30.0)
    request(pol, [1, 5, 6, 7], "a", 0.0, "agent")
    pol.on_hint(Hint("a", "tool_call", "agent", tool="build", expected_gap_s=300.0),
                [(5, "hbm"), (6, "hbm"), (7, "hbm")], 1.0)
    assert pol.expected_gap("agent", "tool_call", "build") is None
    held = [(1, "hbm"), (5, "dram"), (6, "disk"), (7, "dram")]
    for event in ("tool_result", "user", "session_start"):
        moves = pol.on_hint(Hint("a", event, "agent"), held, 120.0)
        assert {(m.key, m.src, m.dst) for m in moves} == {
            (5, "dram", "hbm"), (6, "disk", "hbm"), (7, "dram", "hbm")}, event
    # the tool came back 119 s after it was called (half-octave bins: 90-128 s)
    assert pol.expected_gap("agent", "tool_call", "build") == 128.0
    assert pol.on_hint(Hint("a", "tool_result", "agent"), [(k, "hbm") for k in (5, 6)],
                       121.0) == []
