"""Every profile section on small traces whose answers are known by construction."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kvstore.profile.arrival import arrival_stats, bin_counts, default_bin_s
from kvstore.profile.dist import Dist, cv, percentile
from kvstore.profile.lengths import length_stats
from kvstore.profile.load import Trace
from kvstore.profile.model import Row
from kvstore.profile.quadrants import AGENT_INPUT, LONG_INPUT, LONG_OUTPUT, classify
from kvstore.profile.report import trace_rows
from kvstore.profile.reuse import reuse_stats
from kvstore.profile.sections import profile_rows
from kvstore.profile.sessions import session_stats
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.trace import After, Request


def mooncake(reqs: list[Request]) -> Trace:
    fmt = "mooncake+sessions" if any(r.session_id for r in reqs) else "mooncake"
    return Trace("t.jsonl", fmt, reqs, [r.timestamp_ms / 1000 for r in reqs])


# -- distributions ----------------------------------------------------------------------------
def test_percentiles_match_numpy() -> None:
    rng = random.Random(3)
    for n in (1, 2, 7, 100, 1001):
        vals = [rng.lognormvariate(5, 2) for _ in range(n)]
        d = Dist.of(vals)
        assert d is not None and d.count == n
        for q, got in ((50, d.p50), (90, d.p90), (99, d.p99)):
            assert got == pytest.approx(float(np.percentile(vals, q)), rel=1e-12)
        assert d.mean == pytest.approx(float(np.mean(vals)))
        assert (d.min, d.max) == (min(vals), max(vals))
    assert Dist.of([]) is None
    assert percentile([1, 2, 3, 4], 50) == 2.5
    with pytest.raises(ValueError, match="q must be"):
        percentile([1], 101)


def test_cv() -> None:
    assert cv([2.0, 2.0, 2.0]) == 0.0
    assert cv([1.0, 3.0]) == pytest.approx(0.5)  # std 1, mean 2
    assert cv([5.0]) is None
    rng = random.Random(1)
    gaps = [rng.expovariate(1.0) for _ in range(20000)]
    assert cv(gaps) == pytest.approx(1.0, abs=0.03)  # Poisson arrivals


# -- lengths and quadrants --------------------------------------------------------------------
def test_quadrant_thresholds() -> None:
    assert classify(LONG_INPUT - 1, LONG_OUTPUT - 1) == "chat"
    assert classify(LONG_INPUT, LONG_OUTPUT - 1) == "rag"
    assert classify(AGENT_INPUT - 1, 10) == "rag"
    assert classify(AGENT_INPUT, 10) == "agent"
    assert classify(LONG_INPUT - 1, LONG_OUTPUT) == "reasoning"
    assert classify(LONG_INPUT, LONG_OUTPUT) == "batch"
    assert classify(AGENT_INPUT, LONG_OUTPUT) == "batch"
    assert classify(100, None) == "unknown"


def test_length_stats() -> None:
    rows = [Row(0, 1000, 100), Row(1, 8000, 200, workload="rag"), Row(2, 50_000, 500),
            Row(3, 500, 4000), Row(4, 9000, 0, workload="rag")]
    ln = length_stats(rows)
    assert ln.quadrants == {"chat": 1, "rag": 2, "agent": 1, "reasoning": 1, "batch": 0}
    assert ln.workloads == {"rag": 2}
    assert ln.input_tokens == Dist.of([1000, 8000, 50_000, 500, 9000])
    assert ln.output_tokens == Dist.of([100, 200, 500, 4000, 0])
    assert ln.ratio == Dist.of([10.0, 40.0, 100.0, 0.125])  # output 0 has no ratio
    assert ln.context_tokens == Dist.of([1100, 8200, 50_500, 4500, 9000])
    live = length_stats([Row(0, 1000, None)])
    assert live.output_tokens is None and live.quadrants["unknown"] == 1


@pytest.mark.parametrize(("kind", "quadrant"), [("agent", "agent"), ("reasoning", None)])
def test_generated_quadrants(kind: str, quadrant: str | None) -> None:
    reqs = generate(kind, GenConfig(sessions=20, seed=2))
    ln = length_stats(trace_rows(mooncake(reqs))[0])
    want = {q: 0 for q in ln.quadrants}
    for r in reqs:  # agents resend ~126k tokens and write 200; reasoning writes 4,000
        want[classify(r.input_length, r.output_length)] += 1
    assert ln.quadrants == want
    if quadrant:
        assert ln.quadrants[quadrant] == len(reqs)
    else:
        assert ln.quadrants["reasoning"] + ln.quadrants["batch"] == len(reqs)
        assert ln.output_tokens == Dist.of([4000] * len(reqs))


# -- arrival ----------------------------------------------------------------------------------
def test_bins_count_complete_bins_only() -> None:
    times = [0.0, 10.0, 59.9, 60.0, 61.0, 130.0]  # bins [0,60): 3, [60,120): 2; 130 is partial
    assert bin_counts(times, 60.0) == [3, 2]
    assert bin_counts([], 60.0) == []
    with pytest.raises(ValueError, match="bin_s"):
        bin_counts(times, 0)


def test_arrival_stats_known_pattern() -> None:
    # Four hours: 60 requests in each even hour, 20 in each odd one, evenly spaced.
    times: list[float] = []
    for hour in range(4):
        n = 60 if hour % 2 == 0 else 20
        times += [hour * 3600 + i * 3600 / n for i in range(n)]
    times.append(4 * 3600.0)
    a = arrival_stats(times)
    assert a.bin_s == 3600 and a.bins == 4
    assert (a.peak, a.trough, a.peak_to_trough) == (60, 20, 3.0)
    assert a.span_s == 4 * 3600
    assert a.requests_per_minute == pytest.approx(161 / 240)
    assert a.per_minute is not None and a.per_minute.count == 240
    gaps = [b - x for x, b in zip(times, times[1:], strict=False)]
    assert a.interarrival_cv == pytest.approx(cv(gaps))
    short = arrival_stats(times[:61])  # one hour: minute bins
    assert short.bin_s == 60
    assert default_bin_s(2.9 * 3600) == 60 and default_bin_s(3 * 3600) == 3600
    assert arrival_stats([0.0, 1.0, 2.0, 3.0]).interarrival_cv == 0.0  # perfectly regular


def test_empty_bin_has_no_ratio() -> None:
    a = arrival_stats([0.0, 1.0, 150.0, 181.0], bin_s=60)
    assert a.bins == 3 and a.trough == 0 and a.peak_to_trough is None
    one = arrival_stats([0.0, 70.0], bin_s=60)
    assert one.bins == 1 and one.peak_to_trough is None


# -- reuse ------------------------------------------------------------------------------------
def test_unbounded_reuse_counts_prefixes_only() -> None:
    reqs = [Request(0, 1536, 10, (1, 2, 3)), Request(1, 1536, 10, (1, 2, 4)),
            Request(2, 1536, 10, (5, 2, 3)), Request(3, 512, 10, (1,))]
    rows, _, cache = trace_rows(mooncake(reqs))
    assert [r.hit_blocks for r in rows] == [0, 2, 0, 1]  # (5, 2, 3): a prefix stops at 5
    reuse = reuse_stats(rows, cache)
    assert reuse is not None
    assert (reuse.block_lookups, reuse.hit_blocks, reuse.distinct_blocks) == (10, 3, 5)
    assert reuse.unbounded_hit_rate == pytest.approx(0.3)
    assert reuse.single_use_share == pytest.approx(2 / 5)  # 4 and 5 were seen once
    assert reuse_stats([Row(0, 10, 1)]) is None  # no hashes


def test_batch_reuse_is_its_template() -> None:
    """Every batch job starts with the same 2-block template and nothing else repeats."""
    reqs = generate("batch", GenConfig(sessions=30, seed=4))
    rows, _, cache = trace_rows(mooncake(reqs))
    reuse = reuse_stats(rows, cache)
    assert reuse is not None
    assert reuse.hit_blocks == 2 * (len(reqs) - 1)
    assert reuse.distinct_blocks == sum(len(r.hash_ids) for r in reqs) - 2 * (len(reqs) - 1)


# -- sessions ---------------------------------------------------------------------------------
def test_session_gaps_by_kind() -> None:
    tc, user, end = After("tool_call", "search"), After("user"), After("end")
    reqs = [
        Request(0, 1024, 50, (1, 2), "a", "agent", tc),
        Request(1000, 1024, 50, (9,), "b", "chat", user),
        Request(3000, 1536, 50, (1, 2, 3), "a", "agent", After("tool_call", "shell")),
        Request(4000, 2048, 50, (1, 2, 3, 4), "a", "agent", user),
        Request(61000, 1024, 50, (9, 10), "b", "chat", end),
        Request(100000, 2560, 50, (1, 2, 3, 4, 5), "a", "agent", end),
    ]
    s = session_stats(trace_rows(mooncake(reqs))[0], block_tokens=512)
    assert s is not None and s.sessions == 2 and not s.inferred
    assert s.calls_per_session == Dist.of([4, 2])
    assert list(s.gaps_s) == ["tool_call", "tool_call:search", "tool_call:shell", "user"]
    assert s.gaps_s["tool_call"] == Dist.of([3.0, 1.0])
    assert s.gaps_s["tool_call:search"] == Dist.of([3.0])
    assert s.gaps_s["user"] == Dist.of([96.0, 60.0])
    # read back: a's calls hit 2, 3, 4 blocks; b's second call hits 1
    assert s.read_back_tokens == Dist.of([1024, 1536, 2048, 512])
    assert s.new_tokens == Dist.of([512, 512, 512, 512])
    assert s.duration_s == Dist.of([100.0, 60.0])
    assert session_stats([Row(0, 10, 1)], 512) is None


def test_generated_agent_sessions() -> None:
    """Each agent step resends its whole history: it reads back the previous
    step's blocks (all but its partial last one); the gap after a tool call is
    decode (2 s) plus the tool's latency."""
    reqs = generate("agent", GenConfig(sessions=15, seed=5, scale=0.1))
    rows, _, _ = trace_rows(mooncake(reqs))
    s = session_stats(rows, 512)
    assert s is not None and s.sessions == 15
    by: dict[str, list[Request]] = {}
    for r in reqs:
        by.setdefault(r.session_id or "", []).append(r)
    assert s.calls_per_session == Dist.of([len(v) for v in by.values()])
    back = [min((len(p.hash_ids) - 1) * 512, c.input_length)
            for v in by.values() for p, c in zip(v, v[1:], strict=False)]
    assert s.read_back_tokens == Dist.of(back)
    gaps = s.gaps_s["tool_call"]
    assert gaps.count == sum(len(v) - 1 for v in by.values()) and gaps.min > 2.0
    assert set(s.gaps_s) >= {"tool_call", "tool_call:search", "tool_call:python"}
    assert "user" not in s.gaps_s  # agents only end


def test_sessions_inferred_without_ids() -> None:
    """Without session ids, sessions come from the prefix chain (the replay's
    inference): two conversations on a shared system prompt."""
    reqs = [Request(0, 2048, 10, (1, 2, 3)), Request(1000, 2048, 10, (1, 7, 8)),
            Request(5000, 2560, 10, (1, 2, 3, 4)), Request(9000, 2560, 10, (1, 7, 8, 9))]
    rows, inferred, _ = trace_rows(mooncake(reqs))
    s = session_stats(rows, 512, inferred)
    assert inferred and s is not None and s.inferred
    assert s.sessions == 2 and s.gaps_s["unlabelled"] == Dist.of([5.0, 8.0])


def test_profile_rows_notes_what_it_cannot_compute() -> None:
    azure = Trace("a.csv", "azure", [Request(0, 100, 10, ()), Request(1000, 200, 20, ())],
                  [0.0, 1.0])
    rows, inferred, cache = trace_rows(azure)
    p = profile_rows(rows, source="a.csv", fmt="azure", block_tokens=512, cache=cache)
    assert p.reuse is None and p.sessions is None and cache is None and not inferred
    assert any("no block hashes" in n for n in p.notes)
    assert any(n.startswith("request duration: not derivable") for n in p.notes)
    assert p.to_json()["latency_target"] is None
    assert math.isclose(p.arrival.requests_per_minute, 120.0)
