"""The profile of the real traces in ../shared/traces (skipped when absent).

Conversation (Mooncake): the known figures. Azure 2023 code / conversation:
lengths and peak-to-trough against a direct computation from the CSV. Claude
Code agent (WEKA): session statistics only (loading 7.5M block ids is the cost;
no replay).
"""

from __future__ import annotations

import csv
import gzip
import statistics
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from kvstore.profile.load import load
from kvstore.profile.report import profile_trace, trace_rows
from kvstore.profile.sessions import session_stats
from tests.conftest import SHARED_TRACES

CONVERSATION = SHARED_TRACES / "conversation_trace.jsonl.gz"
AZURE = SHARED_TRACES / "azure2023"
AGENT = SHARED_TRACES / "weka" / "claude_code_agent_trace.jsonl.gz"

pytestmark = [pytest.mark.traces, pytest.mark.slow]


def need(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"shared trace not present at {path}")


def test_conversation_trace_known_figures() -> None:
    need(CONVERSATION)
    prof, _ = profile_trace(load(CONVERSATION), policies=["lru"],
                            capacities=[1000, 2000, 5000, 10000])
    assert prof.requests == 12_031
    assert prof.reuse is not None and prof.reuse.block_lookups == 288_500
    assert round(100 * prof.reuse.unbounded_hit_rate, 1) == 36.6
    assert prof.curve is not None
    lru = [round(100 * h, 1) for _, h in prof.curve.of("lru")]
    # Through the served replay (the sidecar's DRAM alone); the old untimed loop stored
    # each request's partial last block (12,009 of 12,031 end in one) and got
    # 4.5 / 5.4 / 11.2 / 21.2.
    assert lru == [4.5, 5.5, 11.9, 21.5]
    # sessions inferred from the prefix chains: human turn gaps of minutes
    # (DESIGN.md section 1: p50 2 min, p90 8 min)
    s = prof.sessions
    assert s is not None and s.inferred
    gaps = s.gaps_s["unlabelled"]
    assert (round(gaps.p50 / 60), round(gaps.p90 / 60)) == (2, 8)


def _azure_direct(path: Path, bin_s: float) -> tuple[list[int], list[int], list[float]]:
    with gzip.open(str(path), "rt") as fh:
        rows = list(csv.DictReader(fh))
    ins = [int(r["ContextTokens"]) for r in rows]
    outs = [int(r["GeneratedTokens"]) for r in rows]
    ts = sorted(datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows)
    rel = np.array(ts) - ts[0]
    full = int((rel[-1]) // bin_s)
    counts = np.bincount((rel // bin_s).astype(int), minlength=full + 1)[:full]
    return ins, outs, [float(c) for c in counts]


@pytest.mark.parametrize("name", ["code", "conv"])
def test_azure_lengths_and_peak_to_trough(name: str) -> None:
    path = AZURE / f"AzureLLMInferenceTrace_{name}.csv.gz"
    need(path)
    trace = load(path)
    for bin_s in (None, 300.0):
        prof, _ = profile_trace(trace, bin_s=bin_s)
        ins, outs, counts = _azure_direct(path, bin_s or 60.0)
        assert prof.requests == len(ins)
        ln = prof.lengths
        assert ln.input_tokens is not None and ln.output_tokens is not None
        for q, a, b in ((50, ln.input_tokens.p50, ln.output_tokens.p50),
                        (90, ln.input_tokens.p90, ln.output_tokens.p90),
                        (99, ln.input_tokens.p99, ln.output_tokens.p99)):
            assert a == pytest.approx(float(np.percentile(ins, q)))
            assert b == pytest.approx(float(np.percentile(outs, q)))
        a = prof.arrival
        assert a.bin_s == (bin_s or 60.0)  # a one-hour trace: minute bins by default
        assert (a.bins, a.peak, a.trough) == (len(counts), max(counts), min(counts))
        if min(counts) > 0:
            assert a.peak_to_trough == pytest.approx(max(counts) / min(counts))
        else:
            assert a.peak_to_trough is None
        assert prof.reuse is None and prof.curve is None


def test_agent_trace_sessions() -> None:
    need(AGENT)
    trace = load(AGENT)
    assert len(trace.requests) == 31_532 and trace.format == "mooncake+sessions"
    rows, inferred, _ = trace_rows(trace)
    s = session_stats(rows, 512, inferred)
    assert s is not None and not inferred
    calls: dict[str, list[float]] = {}
    for r in rows:
        calls.setdefault(r.session or "", []).append(r.t_s)
    assert s.sessions == len(calls) == 474
    assert s.calls_per_session is not None
    assert s.calls_per_session.p50 == statistics.median(len(v) for v in calls.values()) == 46
    tool, user = s.gaps_s["tool_call"], s.gaps_s["user"]
    assert (tool.p50, user.p50) == (17.0, 216.0)  # a tool returns in seconds, a user in minutes
    # every tool call is followed by another call of its session
    assert tool.count == sum(1 for r in rows if r.after == "tool_call")
    # agents resend their history: they read back ~100x what they add
    assert s.read_back_tokens is not None and s.new_tokens is not None
    assert s.read_back_tokens.p50 > 100 * s.new_tokens.p50
