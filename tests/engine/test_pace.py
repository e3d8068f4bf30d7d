"""Long shared-memory calls let the event loop go by the time they held it (issue 25:
the loop's lag), not after a fixed count of blocks: another task gets turns during a
Reserve, Commit or Acquire of many blocks when their blocks cost more than the budget,
and none when the whole call fits in it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import xxhash

from kvstore.engine import pace
from kvstore.engine.blocks import NewBlock
from kvstore.engine.pace import Pace
from tests.blocks import make_chain

KiB = 2**10


def test_a_pace_is_due_once_its_budget_has_passed() -> None:
    p = Pace(0.05)
    assert not p.due()
    p.until -= 1.0  # as if 1 s had passed
    assert p.due()
    asyncio.run(p.pause())
    assert p.yields == 1 and not p.due()
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        Pace(0)


async def _turns_during(coro: Any) -> tuple[Any, int]:
    """``coro``'s result and how many turns a task that only yields got meanwhile."""
    turns = 0
    done = False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.get_running_loop().create_task(ticker())
    await asyncio.sleep(0)
    before = turns
    try:
        result = await coro
    finally:
        done = True
        await task
    return result, turns - before


def _save_and_read(server: Any, ns: str, n: int) -> tuple[int, int, int]:
    """Reserve, Commit and Acquire ``n`` blocks on the server's loop: the turns another
    task got during each."""
    plane = server.engine.plane
    chain = make_chain(n, 4 * KiB, seed=21)

    async def run() -> tuple[int, int, int]:
        slots, r_turns = await _turns_during(plane.reserve(
            ns, [(b.block_hash, len(b.payload)) for b in chain]))
        assert all(s is not None for s in slots)
        for s, b in zip(slots, chain, strict=True):
            plane.view(s)[:] = b.payload
        items = [(s, NewBlock(b.block_hash, b.parent_hash, b.token_ids, b"")) for s, b in
                 zip(slots, chain, strict=True)]
        stored, c_turns = await _turns_during(plane.commit(
            ns, items, checksums=[xxhash.xxh3_64_intdigest(b.payload) for b in chain]))
        assert stored == n
        (lease, found), a_turns = await _turns_during(
            plane.acquire(ns, [b.block_hash for b in chain]))
        assert all(f is not None and f[0] is not None for f in found)
        await plane.release(lease.lease_id)
        return r_turns, c_turns, a_turns

    return server.run(run())  # type: ignore[no-any-return]


def test_reserve_commit_and_acquire_let_the_loop_go_by_time(server_factory: Any,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    server = server_factory(disk={"enabled": False})
    # A budget no block fits in: a turn for others between (about) every two blocks.
    monkeypatch.setattr(pace, "YIELD_S", 1e-9)
    turns = _save_and_read(server, "paced", 40)
    assert all(t >= 20 for t in turns), turns
    # A budget the whole call fits in: no turn at all while it runs.
    monkeypatch.setattr(pace, "YIELD_S", 60.0)
    assert _save_and_read(server, "unpaced", 40) == (0, 0, 0)
