"""The engine's contract with the policy on the paths that serve traffic: admission on
every path, one call per request, interleaved requests, sessions scoped by namespace,
shared blocks, the cost model (issue: the policy as users get it)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest
from kvstore.policies import Hint, Move, Plan, RequestInfo, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine, tier_specs
from kvstore.engine.dataplane import SlotPlane
from kvstore.errors import InvalidArgument
from kvstore.tiers.dram import DramTier
from kvstore.tiers.memory import MemoryTier
from kvstore.types import BlockKey, Medium, SessionKey
from tests.engine.test_engine import Clock, KiB, new_blocks


class Spy(LRUPolicy):
    """LRU that records requests and hints, refuses keys listed in ``refuse``, and
    drops every block of a session at its end."""

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self.requests: list[RequestInfo] = []
        self.hints: list[tuple[Hint, list[tuple[Hashable, str]]]] = []
        self.refuse: set[Hashable] = set()

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        self.requests.append(req)
        plan = super().on_request(req, now)
        return Plan({k: t for k, t in plan.admit.items() if k not in self.refuse})

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        self.hints.append((hint, list(keys)))
        return [Move(k, t, None) for k, t in keys] if hint.event == "session_end" else []


def engine(*tiers, policy=None, **kw) -> tuple[Engine, Spy]:
    tiers = tiers or (MemoryTier(64 * KiB, name="dram", medium=Medium.CPU),)
    pol = policy or Spy(tier_specs(tiers))
    return Engine(list(tiers), pol, clock=Clock(), **kw), pol


def hashes(blocks) -> list[bytes]:
    return [b.block_hash for b in blocks]


def held(eng: Engine, chain: list[bytes]) -> int:
    """Leading blocks of ``chain`` in the index (a lookup would count as a use)."""
    n = 0
    for h in chain:
        if eng.index.get_hash("ns", h) is None:
            break
        n += 1
    return n


async def test_the_shared_memory_commit_path_applies_admission():
    dram = DramTier(64 * KiB, segment_prefix="kvtest")
    eng, spy = engine(dram)
    plane = SlotPlane(eng, dram)
    blocks = new_blocks(3)
    eng.lookup("ns", hashes(blocks), "s", "chat", request_id="r1")
    spy.refuse = {BlockKey("ns", blocks[2].block_hash)}  # too late: the plan is made
    spy2 = new_blocks(3, seed=4)
    spy.refuse = {BlockKey("ns", spy2[1].block_hash), BlockKey("ns", spy2[2].block_hash)}
    eng.lookup("ns", hashes(spy2), "s2", "chat", request_id="r2")
    slots = await plane.reserve("ns", [(b.block_hash, len(b.payload)) for b in spy2],
                                request_id="r2")
    assert slots[0] is not None and slots[1] is None and slots[2] is None
    plane.view(slots[0])[:] = spy2[0].payload
    assert await plane.commit("ns", [(slots[0], spy2[0])], request_id="r2") == 1
    assert eng.lookup("ns", hashes(spy2)) == [Medium.CPU]
    await eng.close()


async def test_a_repeated_lookup_of_one_request_is_counted_once():
    eng, spy = engine()
    blocks = new_blocks(4)
    await eng.put("ns", blocks[:2], "s", "chat")
    for _ in range(5):  # vLLM asks again on every step it cannot schedule the request
        assert eng.lookup("ns", hashes(blocks), "s", "chat", request_id="r1") == [
            Medium.CPU] * 2
    assert len([r for r in spy.requests if len(r.keys) == 4]) == 1
    assert eng.stats.lookups == 1 and eng.stats.lookup_hit_blocks == 2


async def test_interleaved_requests_keep_their_own_admissions():
    eng, spy = engine()
    a, b = new_blocks(2, seed=1), new_blocks(2, seed=2)
    eng.lookup("ns", hashes(a), "sa", "chat", request_id="ra")
    eng.lookup("ns", hashes(b), "sb", "chat", request_id="rb")  # before a's put
    assert await eng.put("ns", a, request_id="ra") == (2, 0)
    assert await eng.put("ns", b, request_id="rb") == (2, 0)
    assert len(spy.requests) == 2, "the puts used their requests' plans"


async def test_a_put_without_a_lookup_gets_a_request_of_its_own():
    eng, spy = engine()
    blocks = new_blocks(3)
    spy.refuse = {BlockKey("ns", blocks[2].block_hash)}
    assert await eng.put("ns", blocks, "s", "chat") == (2, 0)
    (req,) = spy.requests
    assert req.keys == [BlockKey("ns", h) for h in hashes(blocks)]
    assert req.session_id == SessionKey("ns", "s") and req.workload == "chat"


async def test_sessions_are_scoped_by_namespace():
    eng, spy = engine(MemoryTier(256 * KiB, name="dram", medium=Medium.CPU))
    mine, theirs = new_blocks(2, seed=1), new_blocks(2, seed=2)
    await eng.put("tenant-a", mine, "conv-1", "chat")
    await eng.put("tenant-b", theirs, "conv-1", "chat")  # same session id, other tenant
    eng.hint(Hint("conv-1", "session_end"), "tenant-a")
    await eng.mover.run_pending()
    assert eng.lookup("tenant-a", hashes(mine)) == []
    assert eng.lookup("tenant-b", hashes(theirs)) == [Medium.CPU] * 2
    assert spy.hints[0][0].session_id == SessionKey("tenant-a", "conv-1")
    with pytest.raises(InvalidArgument, match="namespace"):
        eng.hint(Hint("conv-1", "turn_end"))


async def test_a_shared_block_is_never_dropped_for_a_session_end():
    eng, _ = engine(MemoryTier(256 * KiB, name="dram", medium=Medium.CPU))
    system = new_blocks(2, seed=7)  # a system prompt both conversations start with
    a = system + [NewBlock(b"\xa1" * 32, system[-1].block_hash, (1,), b"a" * 4096)]
    b = system + [NewBlock(b"\xb1" * 32, system[-1].block_hash, (2,), b"b" * 4096)]
    eng.lookup("ns", hashes(a), "a", "chat", request_id="ra")
    await eng.put("ns", a, request_id="ra")
    eng.lookup("ns", hashes(b), "b", "chat", request_id="rb")
    await eng.put("ns", b, request_id="rb")
    eng.hint(Hint("a", "session_end"), "ns")
    await eng.mover.run_pending()
    assert held(eng, hashes(b)) == 3, "b still needs the prompt"
    assert held(eng, hashes(a)) == 2, "only a's own block went"
    eng.hint(Hint("b", "session_end"), "ns")
    await eng.mover.run_pending()
    # The prompt was used by two sessions: the next conversation will likely want it
    # too, so a session's end leaves it to eviction.
    assert len(eng.index) == 2 and held(eng, hashes(system)) == 2


async def test_conversations_sharing_a_system_prompt_are_not_one_session():
    eng, spy = engine(MemoryTier(256 * KiB, name="dram", medium=Medium.CPU))
    system = new_blocks(2, seed=7)
    a = hashes(system) + [b"\xa1" * 32, b"\xa2" * 32]
    b = hashes(system) + [b"\xb1" * 32, b"\xb2" * 32]
    eng.lookup("ns", a)
    eng.lookup("ns", b)
    eng.lookup("ns", a + [b"\xa3" * 32])  # a's next turn
    sa, sb, sa2 = (r.session_id for r in spy.requests)
    assert sa != sb and sa == sa2


async def test_the_policy_is_told_whether_the_client_named_the_session():
    """A lookup without a session id gets an inferred one, and says so
    (``session_named``: the guarded policy bets on per-block reuse counts then)."""
    eng, spy = engine(MemoryTier(256 * KiB, name="dram", medium=Medium.CPU))
    blocks = hashes(new_blocks(2, seed=3))
    eng.lookup("ns", blocks)
    eng.lookup("ns", blocks, session_id="s")
    unnamed, named = spy.requests
    assert unnamed.session_id and not unnamed.session_named
    assert named.session_id == SessionKey("ns", "s") and named.session_named


async def test_the_cost_model_cuts_the_served_prefix_and_sizes_come_from_payloads():
    """A hit in a tier that loses to recompute is not served; the policy sees the
    block size the namespace stores and the engine's per-tier verdict."""
    fast = MemoryTier(16 * KiB, name="dram", medium=Medium.CPU)
    slow = MemoryTier(64 * KiB, name="redis", medium=Medium.REMOTE)
    # 4 KiB blocks of 16 tokens at 1e6 tokens/s: recompute 16 us; redis at 1 GB/s
    # reads 4 KiB in 4 us (worth it). At 1.6e7 tokens/s recompute takes 1 us: DRAM
    # (0.2 us) still wins, redis loses.
    slow_prefill = CostModel(prefill_tokens_per_s=1e6)
    eng, spy = engine(fast, slow, cost=slow_prefill, write_back=False)
    blocks = new_blocks(6)
    await eng.put("ns", blocks[:4])
    await eng.put("ns", new_blocks(2, seed=9))  # pushes 2 of the first chain down
    assert eng.lookup("ns", hashes(blocks[:4])) == [Medium.CPU] * 2 + [Medium.REMOTE] * 2
    req = spy.requests[-1]
    assert req.block_bytes == 4 * KiB and req.block_tokens == 16 and req.worth == (True, True)
    fast_prefill = CostModel(prefill_tokens_per_s=1.6e7)
    eng2, spy2 = engine(MemoryTier(16 * KiB, name="dram", medium=Medium.CPU),
                        MemoryTier(64 * KiB, name="redis", medium=Medium.REMOTE),
                        cost=fast_prefill, write_back=False)
    await eng2.put("ns", blocks[:4])
    await eng2.put("ns", new_blocks(2, seed=9))
    assert eng2.lookup("ns", hashes(blocks[:4])) == [Medium.CPU] * 2  # redis loses
    assert spy2.requests[-1].worth == (True, False)


async def test_blocks_stored_under_an_unnamed_lookups_request_are_unnamed_too() -> None:
    """A lookup that names no session (the engine infers it from the chain) opens its
    request; blocks the lookup did not plan (the decode blocks a connector saves when
    the request finishes) get a request of their own from the policy, which must say
    the session was inferred as the lookup's did. Before, it said named: on traffic
    without sessions half of the policy's requests counted as named, and the guarded
    policy took the named-session bets (a generated sessionless reasoning trace behind
    an engine cache: up to 2.9 points below LRU)."""
    eng, spy = engine()
    await eng.start()
    chain = new_blocks(4)
    eng.lookup("ns", hashes(chain[:2]), "", "", request_id="r1")
    assert await eng.put("ns", chain, request_id="r1") == (4, 0)  # two unplanned blocks
    eng.lookup("ns", hashes(chain[:3]), "s", "chat", request_id="r2")
    assert await eng.put("ns", new_blocks(2, seed=9), request_id="r2") == (2, 0)
    assert [r.session_named for r in spy.requests] == [False, False, True, True]
    assert spy.requests[1].session_id == spy.requests[0].session_id  # the inferred one
    await eng.close()


async def test_a_requests_decode_blocks_do_not_evict_each_other() -> None:
    """The decode blocks a connector saves when its request finishes continue the
    request's chain but are not in its lookup. The store kept the lookup's blocks and
    not the ones it was storing: in a full tier it evicted the first decode block to
    make room for the next, and kept a tail no prefix lookup reaches (behind an engine
    cache the workload bets lost parts of reasoning outputs this way). Now the blocks
    stored are kept too: the chain's head goes in, what does not fit is cut."""
    eng, _ = engine(MemoryTier(16 * KiB, name="dram", medium=Medium.CPU))
    await eng.start()
    chain = new_blocks(5)  # 4 KiB each: the tier holds four
    eng.lookup("ns", hashes(chain[:2]), "s", "chat", request_id="r1")
    assert await eng.put("ns", chain[:2], request_id="r1") == (2, 0)
    assert await eng.put("ns", chain[2:], request_id="r1") == (2, 0)  # the decode blocks
    assert eng.stats.puts_cut == 1
    assert eng.lookup("ns", hashes(chain)) == [Medium.CPU] * 4
    await eng.close()

