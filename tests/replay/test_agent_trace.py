"""The real Claude Code agent trace (../shared/traces/weka); skipped when absent.

A slice keeps the test short; the whole trace is a benchmark command
(docs/BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.replay.trace import Request, load_trace
from tests.replay.helpers import replay

TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "weka" / \
    "claude_code_agent_trace.jsonl.gz"

pytestmark = [
    pytest.mark.traces,
    pytest.mark.slow,
    pytest.mark.skipif(not TRACE.exists(), reason=f"agent trace not present at {TRACE}"),
]


@pytest.fixture(scope="module")
def trace() -> list[Request]:
    return load_trace(TRACE)[:3000]


def test_workload_beats_the_tool_call_ttl_rule_and_lru(trace: list[Request]) -> None:
    """On agents the hints are what counts: the learned waits beat the fixed 60 s hold,
    which beats LRU (whole trace, three sizes: docs/BENCHMARKS.md)."""
    rates = {name: replay(trace, name, [("dram", 500)]).hit_rate
             for name in ("lru", "ttl", "workload")}
    assert rates["workload"] > rates["ttl"] > rates["lru"], rates
