"""The live profile: its bounds, and a real server driven request by request
from a generated trace, checked against the offline profile of the same
requests (over gRPC, on /metrics and through ``kvstore profile --server``)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstore.cli import main
from kvstore.client import KVStoreClient
from kvstore.profile.dist import Dist
from kvstore.profile.live import LiveProfile, RecentBlocks
from kvstore.profile.load import Trace
from kvstore.profile.model import Profile
from kvstore.profile.report import trace_rows
from kvstore.profile.sections import profile_rows
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.trace import Request
from kvstore.types import BlockData
from tests.conftest import free_port

#: The hint a connector sends for each trace ``after`` kind.
EVENT = {"tool_call": "tool_call", "user": "turn_end", "end": "session_end"}
BLOCK_TOKENS = 512


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def h(i: int) -> bytes:
    return i.to_bytes(8, "big")


# -- bounds -----------------------------------------------------------------------------------
def test_window_ring_and_block_cap() -> None:
    clock = Clock()
    live = LiveProfile(window_s=100.0, max_requests=3, max_blocks=4, clock=clock)
    live.on_lookup("ns", [h(1), h(2)], "s", "chat")
    clock.now = 10
    live.on_lookup("ns", [h(1), h(2), h(3)], "s", "chat")
    live.on_lookup("other", [h(1)])  # another namespace: a different block
    rows, bt = live.rows()
    assert [r.hit_blocks for r in rows] == [0, 2, 0] and bt == 0
    clock.now = 20
    live.on_lookup("ns", [h(5), h(6)])  # ring of 3: the first request goes
    rows, _ = live.rows()
    assert [r.t_s for r in rows] == [10, 10, 20]
    # generations of 2 blocks: storing 5 and 6 closed the one holding (ns, 1, 2, 3)
    clock.now = 30
    live.on_lookup("ns", [h(1), h(2), h(3)])
    assert live.rows()[0][-1].hit_blocks == 0  # (ns, 1) was forgotten by the block cap
    clock.now = 200  # everything is older than the window
    assert live.rows()[0] == []
    live.on_lookup("ns", [h(5)])
    assert live.rows()[0][-1].hit_blocks == 0


def test_hints_and_stores() -> None:
    clock = Clock()
    live = LiveProfile(clock=clock)
    live.on_lookup("ns", [h(1)], "a", "agent")
    live.on_lookup("ns", [h(9)], "b", "chat")
    live.on_hint("a", "tool_call", "search", 120)
    live.on_hint("a", "tool_result")  # says nothing about what followed
    live.on_hint("zzz", "turn_end", "", 5)  # unknown session: ignored
    live.on_store([(1024, 16), (512, 8)])
    rows, bt = live.rows()
    assert bt == 16 and live.kv_bytes_per_token == pytest.approx(1536 / 24)
    assert (rows[0].after, rows[0].tool, rows[0].output_tokens) == ("tool_call", "search", 120)
    assert (rows[1].after, rows[1].output_tokens, rows[1].input_tokens) == (None, None, 16)
    snap = live.snapshot()
    assert snap.lengths.quadrants["unknown"] == 1 and snap.lengths.quadrants["chat"] == 1
    assert any("output length" in n for n in snap.notes)
    with pytest.raises(ValueError):
        LiveProfile(window_s=0)


def test_recent_blocks_generations() -> None:
    a, b, c = h(1), h(2), h(3)
    rb = RecentBlocks(window_s=100.0, max_blocks=1000)
    assert rb.lookup("ns", [a], 0.0) == 0
    assert rb.lookup("ns", [b], 60.0) == 0  # half a window: a's generation closes
    assert rb.lookup("ns", [a, b], 70.0) == 2  # the closed generation still counts
    assert rb.lookup("ns", [c], 130.0) == 0  # closes again: the t=0 generation goes
    assert rb.lookup("ns", [b, a], 140.0) == 2  # both were seen again at t=70
    rb.expire(300.0)  # a whole window later: nothing is remembered
    assert len(rb) == 0 and rb.lookup("ns", [b], 300.0) == 0
    small = RecentBlocks(window_s=1e9, max_blocks=10)
    for i in range(100):
        small.lookup("ns", [h(1000 + i)], float(i))
        assert len(small) <= 10


# -- a real server ----------------------------------------------------------------------------
def drive(address: str, clock: Clock, reqs: Sequence[Request], shared_memory: bool) -> int:
    """Send each request as a connector would: lookup, put the missed blocks, hint."""
    hit = 0
    with KVStoreClient(address, shared_memory=shared_memory) as kv:
        for r in reqs:
            clock.now = r.timestamp_ms / 1000
            hashes = [h(i) for i in r.hash_ids]
            res = kv.lookup("m", hashes, session_id=r.session_id, workload=r.workload)
            hit += res.num_hit
            missed = [BlockData(hashes[j], hashes[j - 1] if j else None, [7] * BLOCK_TOKENS,
                                bytes([j % 251]) * 64) for j in range(res.num_hit, len(hashes))]
            if missed:
                kv.put("m", missed, session_id=r.session_id, workload=r.workload)
            assert r.after is not None and r.session_id is not None
            kv.hint(r.session_id, EVENT[r.after.kind], workload=r.workload, tool=r.after.tool,
                    namespace="m", output_tokens=r.output_length)
    return hit


def offline(reqs: Sequence[Request]) -> Profile:
    """The offline profile of the same requests as the sidecar sees them: inputs in
    whole hashed blocks, times as the server's clock read them."""
    seen = [Request(r.timestamp_ms, len(r.hash_ids) * BLOCK_TOKENS, r.output_length, r.hash_ids,
                    r.session_id, r.workload, r.after) for r in reqs]
    trace = Trace("gen", "mooncake+sessions", seen, [r.timestamp_ms / 1000 for r in seen])
    rows, inferred, cache = trace_rows(trace)
    return profile_rows(rows, source="gen", fmt="mooncake+sessions", block_tokens=BLOCK_TOKENS,
                        inferred=inferred, cache=cache)


def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm-commit", "grpc-put"])
def test_live_profile_matches_offline(server_factory: Any, shared_memory: bool, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    reqs = generate("mixed", GenConfig(sessions=14, duration_s=900, seed=11, scale=0.02))
    assert len({r.session_id for r in reqs}) == 14 and len(reqs) > 40
    port = free_port()
    srv = server_factory(server={"metrics_port": port})
    live = srv.server.profile
    clock = Clock()
    live.clock = clock
    live.window_s = 1e9  # the whole trace is one window here
    drive(srv.address, clock, reqs, shared_memory)

    with KVStoreClient(srv.address, shared_memory=False) as kv:
        got = kv.profile()
    want = offline(reqs)
    assert got.format == "live" and got.requests == want.requests == len(reqs)
    assert got.block_tokens == BLOCK_TOKENS
    assert got.kv_bytes_per_token == pytest.approx(64 / BLOCK_TOKENS)
    assert got.lengths == want.lengths
    assert got.arrival == want.arrival
    assert got.reuse is not None and want.reuse is not None
    assert (got.reuse.block_lookups, got.reuse.hit_blocks, got.reuse.unbounded_hit_rate) == (
        want.reuse.block_lookups, want.reuse.hit_blocks, want.reuse.unbounded_hit_rate)
    assert got.sessions == want.sessions
    assert got.sessions is not None and set(got.sessions.gaps_s) >= {"tool_call", "user"}
    assert 0 < got.reuse.unbounded_hit_rate < 1

    m = metrics(srv.server.metrics_port)
    assert m[("kvstore_profile_window_requests", ())] == len(reqs)
    assert m[("kvstore_profile_unbounded_hit_rate", ())] == pytest.approx(
        want.reuse.unbounded_hit_rate)
    assert m[("kvstore_profile_sessions", ())] == 14
    assert m[("kvstore_profile_input_tokens", (("quantile", "0.5"),))] == pytest.approx(
        want.lengths.input_tokens.p50 if want.lengths.input_tokens else -1)
    sessions = want.sessions
    assert sessions is not None
    tool: Dist = sessions.gaps_s["tool_call"]
    assert m[("kvstore_profile_gap_seconds", (("after", "tool_call"), ("quantile", "0.9")))] \
        == pytest.approx(tool.p90)
    assert m[("kvstore_profile_quadrant_requests", (("quadrant", "chat"),))] == \
        want.lengths.quadrants["chat"]

    out_json = tmp_path / "live.json"
    assert main(["profile", "--server", srv.address, "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    assert doc["format"] == "live" and doc["requests"] == len(reqs) and doc["curve"] is None
    assert doc["reuse"]["unbounded_hit_rate"] == want.reuse.unbounded_hit_rate
    assert f"(live, window 1000000000 s): {len(reqs)} requests" in text
    assert "Sessions: 14 (from session ids)" in text and "Hit rate vs capacity" not in text


async def test_async_client_profile(server: Any) -> None:
    from kvstore.client import AsyncKVStoreClient

    async with AsyncKVStoreClient(server.address, shared_memory=False) as kv:
        await kv.lookup("m", [h(1), h(2)], session_id="s1", workload="chat")
        await kv.hint("s1", "turn_end", workload="chat", namespace="m", output_tokens=42)
        prof = await kv.profile()
    assert prof.requests == 1 and prof.lengths.output_tokens == Dist.of([42])
    assert prof.sessions is not None and prof.sessions.sessions == 1
