"""Sessions and requests are keys, never strings joined with a separator: a namespace
or a session id may hold any character (``|``, ``@``, ``/``, ``:``, ``\\0``, ``~``,
any unicode), and what the policy is told about a block's session is the session
its request was looked up under (issue: ids that never collide)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Hashable, Sequence

from hypothesis import given
from hypothesis import strategies as st
from kvstore.policies import BlockInfo, Hint, TierSpec

from kvstore.engine.core import Engine, tier_specs
from kvstore.engine.dataplane import SlotPlane
from kvstore.tiers.dram import DramTier
from kvstore.types import BlockKey, SessionKey
from tests.engine.test_engine import Clock, KiB, new_blocks
from tests.engine.test_requests import Spy, hashes
from tests.fuzzing import FUZZ

#: Characters a separator could be made of, and a few that are not.
_CHARS = "|@/:\0~ \\%#.-_aZ9é中🙂"
_NAMES = st.text(alphabet=_CHARS, max_size=6)
#: A session id; "" = unnamed (the engine infers one). Named ids that look like an
#: inferred one (``~`` and a number) are left out: they name the inferred session on
#: purpose (events carry it, so a client may hint it).
_SESSIONS = _NAMES.filter(lambda s: re.fullmatch(r"~\d+", s) is None)


class Recorder(Spy):
    """The spy, also recording the session each stored block is filed under."""

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        super().__init__(tiers)
        self.inserted: dict[Hashable, Hashable] = {}

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self.inserted[info.key] = info.session_id
        super().on_insert(info, tier, now)


async def _scenario(pairs: list[tuple[str, str]], ended: int) -> None:
    dram = DramTier(256 * KiB, segment_prefix="kvtest")
    pol = Recorder(tier_specs([dram]))
    eng = Engine([dram], pol, clock=Clock())
    plane = SlotPlane(eng, dram)
    try:
        chains = [new_blocks(2, seed=100 + i) for i in range(len(pairs))]
        seen: list[Hashable] = []
        for i, ((ns, sid), blocks) in enumerate(zip(pairs, chains, strict=True)):
            # As the connectors store: a lookup with a request id, then the blocks
            # (half over gRPC, half through shared memory) under that request.
            rid = f"req-{i}"
            eng.lookup(ns, hashes(blocks), sid, "chat", request_id=rid)
            seen.append(pol.requests[-1].session_id)
            if i % 2:
                slots = await plane.reserve(ns, [(b.block_hash, len(b.payload)) for b in blocks],
                                            request_id=rid)
                assert all(s is not None for s in slots)
                for s, b in zip(slots, blocks, strict=True):
                    plane.view(s)[:] = b.payload  # type: ignore[arg-type]
                assert await plane.commit(ns, list(zip(slots, blocks, strict=True)),  # type: ignore[arg-type]
                                          request_id=rid) == 2
            else:
                assert await eng.put(ns, blocks, request_id=rid) == (2, 0)
            if sid:
                assert seen[-1] == SessionKey(ns, sid)
            for b in blocks:  # filed under the session the policy saw at the lookup
                assert pol.inserted[BlockKey(ns, b.block_hash)] == seen[-1], (ns, sid)
        assert len(set(seen)) == len(pairs), "two sessions were taken for one"

        # A session's end reaches that session only (by name, or by its request).
        ns, sid = pairs[ended]
        if sid:
            eng.hint(Hint(sid, "session_end"), ns)
        else:
            eng.hint(Hint("", "session_end"), ns, f"req-{ended}")
        await eng.mover.run_pending()
        hint, keys = pol.hints[-1]
        assert hint.session_id == seen[ended]
        assert {k for k, _ in keys} == {BlockKey(ns, b.block_hash) for b in chains[ended]}
        for i, ((ns_i, _), blocks) in enumerate(zip(pairs, chains, strict=True)):
            there = [eng.index.get_hash(ns_i, b.block_hash) is not None for b in blocks]
            assert there == [i != ended] * 2, (i, pairs[i])
    finally:
        await eng.close()


@FUZZ
@given(pairs=st.lists(st.tuples(_NAMES.filter(bool), _SESSIONS), min_size=2, max_size=4,
                      unique=True),
       data=st.data())
def test_sessions_never_mix_whatever_their_names_hold(pairs: list[tuple[str, str]],
                                                      data: st.DataObject) -> None:
    ended = data.draw(st.integers(0, len(pairs) - 1))
    asyncio.run(_scenario(pairs, ended))


def test_the_readme_namespace_files_blocks_under_their_own_session() -> None:
    """The issue's case: a namespace with ``|`` (the README's example), put as the
    connector puts; and a namespace that is another's with ``|`` appended."""
    asyncio.run(_scenario([("llama-8b|bf16|tp0/1", ""), ("llama-8b|bf16|tp0/1", "conv|1"),
                           ("a", "b|c"), ("a|b", "c")], 2))
