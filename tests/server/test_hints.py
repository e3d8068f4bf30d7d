"""Turn hints move a session's blocks between tiers as the policy decides, and
a returning session's prefix is prefetched back up (real server, workload policy)."""

from __future__ import annotations

import time

import pytest
from kvstore.policies import Plan, RequestInfo
from kvstore.policies.lru import LRUPolicy

from kvstore import KVStoreClient, Medium
from tests.blocks import make_chain

KiB = 1024


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError("condition not reached")


def test_hints_offload_prefetch_and_drop(server_factory):
    srv = server_factory(engine={"policy": "workload"}, dram={"capacity": "4MiB"},
                         disk={"capacity": "64MiB"})
    mine = make_chain(6, 64 * KiB, seed=1)
    other = make_chain(3, 64 * KiB, seed=2)
    hashes = [b.block_hash for b in mine]
    with KVStoreClient(srv.address) as c:
        c.put("m", mine, session_id="s1", workload="chat")
        c.put("m", other, session_id="s2", workload="chat")
        srv.drain()  # write-back: every block is on disk too
        assert c.stats().tier("disk").blocks == 9

        # A human will take ten minutes to reply: s1's blocks leave DRAM, s2's stay.
        assert c.hint("s1", "turn_end", workload="chat", expected_gap_ms=600_000,
                      namespace="m") >= 6
        srv.drain()
        assert c.stats().tier("dram").blocks == 3
        assert c.lookup("m", [b.block_hash for b in other]).media == (Medium.CPU,) * 3

        # The session is back: its lookup is served from disk and prefetches the prefix.
        assert c.lookup("m", hashes, session_id="s1").media == (Medium.DISK,) * 6
        srv.drain()
        assert c.lookup("m", hashes, session_id="s1").media == (Medium.CPU,) * 6
        got = c.get("m", hashes)
        assert [g.payload for g in got if g] == [b.payload for b in mine]

        # The session ends: its blocks are worth nothing now, the first to go when room
        # is needed (not dropped at once: an ended session's prefix is often reused).
        c.hint("s1", "session_end", workload="chat", namespace="m")
        srv.drain()
        newcomer = make_chain(60, 64 * KiB, seed=9)  # more than DRAM's free room
        c.put("m", newcomer, session_id="s3", workload="chat")
        srv.drain()
        assert c.lookup("m", [b.block_hash for b in other], session_id="s2").media == (
            Medium.CPU,) * 3, "s2 kept its place"
        media = c.lookup("m", hashes, session_id="s1").media
        assert media.count(Medium.CPU) <= 1, "the ended session's blocks left DRAM first"


def test_a_tool_result_hint_prefetches_the_session_before_its_next_request(server_factory):
    srv = server_factory(engine={"policy": "workload"}, dram={"capacity": "4MiB"},
                         disk={"capacity": "64MiB"})
    mine = make_chain(5, 64 * KiB, seed=3)
    hashes = [b.block_hash for b in mine]
    with KVStoreClient(srv.address) as c:
        c.put("m", mine, session_id="agent-1", workload="agent")
        srv.drain()
        # A long build: the session's blocks leave DRAM for disk while the tool runs.
        assert c.hint("agent-1", "tool_call", workload="agent", tool="build", namespace="m",
                      expected_gap_ms=300_000) == 5
        srv.drain()
        st = c.stats()  # (a lookup now would prefetch the prefix itself)
        assert st.tier("dram").blocks == 0 and st.tier("disk").blocks == 5
        # The build is done: the next request is coming, so the prefix comes up now,
        # before any lookup, and the disk copies stay (a prefetch keeps the slower copy).
        assert c.hint("agent-1", "tool_result", workload="agent", namespace="m") == 5
        srv.drain()
        assert c.lookup("m", hashes).media == (Medium.CPU,) * 5
        st = c.stats()
        assert st.tier("dram").blocks == 5 and st.tier("disk").blocks == 5
        got = c.get("m", hashes)
        assert [g.payload for g in got if g] == [b.payload for b in mine]


def test_the_lookup_answers_the_policys_hbm_keep(server_factory):
    """What a request says its turn ends with reaches the policy through the lookup;
    its HBM keep comes back (the same on a repeated lookup of the request)."""
    import pytest

    from kvstore.errors import InvalidArgument

    srv = server_factory(engine={"policy": "workload", "hbm_keep_max_s": 5.0})
    hashes = [b.block_hash for b in make_chain(3, 4 * KiB, seed=4)]
    with KVStoreClient(srv.address) as c:
        quick = c.lookup("k", hashes, "s1", "agent", request_id="r1", then="tool_call",
                         tool="grep", expected_gap_ms=2000)
        assert quick.keep_ms == 2000
        assert c.lookup("k", hashes, "s1", "agent", request_id="r1").keep_ms == 2000
        slow = c.lookup("k", hashes, "s2", "agent", request_id="r2", then="tool_call",
                        expected_gap_ms=60_000)
        assert slow.keep_ms == 0  # past hbm_keep_max_s: release (offload)
        assert c.lookup("k", hashes, "s3", "agent", request_id="r3",
                        then="session_end").keep_ms == 0
        with pytest.raises(InvalidArgument, match="then: unknown hint event 'later'"):
            c.lookup("k", hashes, "s4", then="later")
    lru = server_factory(engine={"policy": "lru"})
    with KVStoreClient(lru.address) as c:  # a policy without HBM keep never keeps
        assert c.lookup("k", hashes, "s1", then="tool_call", expected_gap_ms=10).keep_ms == 0



class EngineHitSpyPolicy(LRUPolicy):
    """LRU that records what each request's lookup said the engine's own cache held."""

    name = "engine-hit-spy"
    seen: list[int | None] = []
    #: what each lookup said the turn ends with: (then, tool, expected_gap_s)
    said: list[tuple[str, str, float | None]] = []

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        EngineHitSpyPolicy.seen.append(req.engine_hit)
        EngineHitSpyPolicy.said.append((req.then, req.tool, req.expected_gap_s))
        return super().on_request(req, now)


@pytest.fixture
def spy_server(server_factory, monkeypatch):
    """A server whose policy is :class:`EngineHitSpyPolicy` (its records emptied)."""
    from kvstore import policies

    monkeypatch.setitem(policies._REGISTRY, "engine-hit-spy",  # type: ignore[attr-defined]
                        f"{__name__}:EngineHitSpyPolicy")
    EngineHitSpyPolicy.seen = []
    EngineHitSpyPolicy.said = []
    return server_factory(engine={"policy": "engine-hit-spy"})


def test_the_lookup_carries_the_engines_own_hit(spy_server):
    """``num_computed_tokens`` (vLLM's own prefix-cache hit) reaches the policy as the
    blocks the engine holds; absent, it is unknown (None), not 0."""
    srv = spy_server
    chain = make_chain(4, 4 * KiB, seed=5)
    hashes = [b.block_hash for b in chain]
    with KVStoreClient(srv.address) as c:
        c.put("k", chain)  # the namespace's geometry: 16-token blocks
        tokens = len(chain[0].token_ids)
        c.lookup("k", hashes, "s1", request_id="a", num_computed_tokens=2 * tokens + 3)
        c.lookup("k", hashes, "s1", request_id="b", num_computed_tokens=0)
        c.lookup("k", hashes, "s1", request_id="c")
    assert EngineHitSpyPolicy.seen[-3:] == [2, 0, None]
    with KVStoreClient(srv.address, shared_memory=True) as c:  # the same from lookup_and_hold
        for rid, computed in (("d", tokens + 1), ("e", 0), ("f", None)):
            found, held = c.lookup_and_hold("k", hashes, "s1", request_id=rid,
                                            num_computed_tokens=computed)
            assert found.num_hit == 4 and held is not None
            held.let_go_all()
    assert EngineHitSpyPolicy.seen[-3:] == [1, 0, None]


def test_lookup_and_hold_says_what_the_turn_ends_with_as_lookup_does(spy_server):
    """``then``, ``tool`` and ``expected_gap_ms`` reach the policy from
    ``lookup_and_hold`` as they do from ``lookup`` (before, the held form dropped them,
    so a reader that looked up and held could not ask for a keep)."""
    srv = spy_server
    chain = make_chain(3, 4 * KiB, seed=9)
    hashes = [b.block_hash for b in chain]
    with KVStoreClient(srv.address, shared_memory=True) as c:
        c.put("k", chain)
        c.lookup("k", hashes, "s1", request_id="a", then="tool_call", tool="grep",
                 expected_gap_ms=1500)
        found, held = c.lookup_and_hold("k", hashes, "s1", request_id="b",
                                        then="tool_call", tool="grep",
                                        expected_gap_ms=1500)
        assert found.num_hit == 3 and held is not None
        held.let_go_all()
        c.lookup_and_hold("k", hashes, "s1", request_id="c")
    assert EngineHitSpyPolicy.said[-3:] == [("tool_call", "grep", 1.5),
                                            ("tool_call", "grep", 1.5), ("", "", None)]
