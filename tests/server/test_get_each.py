"""``get_each`` (a sink sized from each payload, what the LMCache plugin uses) and
``get_into`` (built on it), on both data paths, sync and async."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore import AsyncKVStoreClient, KVStoreClient
from tests.blocks import make_chain


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "grpc"])
def test_get_each_hands_every_stored_payload_to_the_sink(server: Any, shm: bool) -> None:
    blocks = make_chain(6, 50_000, seed=3)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(server.address, shared_memory=shm) as c:
        assert c.uses_shared_memory is shm
        c.put("ns", blocks[:2] + blocks[3:])
        seen: dict[int, bytes] = {}

        def sink(i: int, payload: bytes | bytearray | memoryview) -> int:
            seen[i] = bytes(payload)  # a view of the slot: copied before returning
            return len(payload) if i != 4 else 0  # a sink may decline a block

        sizes = c.get_each("ns", hashes, sink)
        assert sizes == [50_000, 50_000, 0, 50_000, 0, 50_000]
        assert seen == {i: bytes(b.payload) for i, b in enumerate(blocks) if i != 2}

        buffers = [bytearray(50_000) for _ in blocks]
        assert c.get_into("ns", hashes, buffers) == [50_000, 50_000, 0, 50_000, 50_000, 50_000]
        assert buffers[5] == blocks[5].payload and buffers[2] == bytearray(50_000)


async def test_async_get_each_both_paths(server: Any) -> None:
    blocks = make_chain(3, 10_000, seed=4)
    for shm in (True, False):
        async with AsyncKVStoreClient(server.address, shared_memory=shm) as c:
            await c.put(f"a{shm}", blocks)
            got: dict[int, bytes] = {}

            def sink(i: int, payload: bytes | bytearray | memoryview,
                     got: dict[int, bytes] = got) -> int:
                got[i] = bytes(payload)
                return len(payload)

            sizes = await c.get_each(f"a{shm}", [b.block_hash for b in blocks], sink)
            assert sizes == [10_000] * 3
            assert [got[i] for i in range(3)] == [bytes(b.payload) for b in blocks]


def test_a_verified_read_does_not_wait_for_its_release(server_factory: Any) -> None:
    """Reads are checked against each slot's checksum after the sink took them, so the
    release runs in the background: a sink that outlives its lease still gets the
    right bytes once (no read again), and close() leaves no lease behind."""
    import time

    srv = server_factory(server={"lease_seconds": 0.3})
    blocks = make_chain(3, 10_000, seed=5)
    calls: list[int] = []

    def slow(i: int, payload: bytes | bytearray | memoryview) -> int:
        calls.append(i)
        time.sleep(0.25)  # three blocks: the lease runs out before the release
        return len(payload) if bytes(payload) == bytes(blocks[i].payload) else 0

    with KVStoreClient(srv.address, shared_memory=True) as c:
        c.put("ns", blocks)
        assert c.get_each("ns", [b.block_hash for b in blocks], slow) == [10_000] * 3
        assert calls == [0, 1, 2]
        assert c.get("ns", [blocks[0].block_hash])[0].payload == blocks[0].payload
    deadline = time.monotonic() + 5  # the sweeper ends leases past their time
    while time.monotonic() < deadline and len(srv.engine.leases):
        time.sleep(0.05)
    assert len(srv.engine.leases) == 0 and not srv.engine.leases.pins
    srv.run(srv.engine.mover.drain())
    with KVStoreClient(srv.address, shared_memory=True) as c:  # nothing was dropped
        assert [b.payload for b in c.get("ns", [b.block_hash for b in blocks])] == [
            b.payload for b in blocks]


async def test_async_close_waits_for_background_releases(server: Any) -> None:
    blocks = make_chain(4, 10_000, seed=6)
    async with AsyncKVStoreClient(server.address, shared_memory=True) as c:
        await c.put("ns", blocks)
        for _ in range(5):
            got = await c.get("ns", [b.block_hash for b in blocks])
            assert [b.payload for b in got] == [b.payload for b in blocks]
    assert len(server.engine.leases) == 0



@pytest.mark.parametrize("blocking", [True, False], ids=["sync", "async"])
async def test_a_sink_that_fails_leaves_no_lease_behind(server: Any, blocking: bool) -> None:
    """A get longer than one Acquire (256 blocks) whose sink raises in its second
    chunk: the error reaches the caller and the chunk's lease ends then, not when the
    server's clock runs it out (it held the blocks' slots pinned until then, and a
    delete of them waited). The blocks before it were read, each where it belongs."""
    n = 300
    blocks = make_chain(n, 1_000, seed=7)
    hashes = [b.block_hash for b in blocks]
    seen: list[int] = []

    def failing(i: int, payload: bytes | bytearray | memoryview) -> int:
        if i == 260:
            raise RuntimeError("the sink failed")
        assert bytes(payload) == bytes(blocks[i].payload)
        seen.append(i)
        return len(payload)

    if blocking:
        with KVStoreClient(server.address, shared_memory=True) as c:
            c.put("ns", blocks)
            with pytest.raises(RuntimeError, match="the sink failed"):
                c.get_each("ns", hashes, failing)
    else:
        async with AsyncKVStoreClient(server.address, shared_memory=True) as ac:
            await ac.put("ns", blocks)
            with pytest.raises(RuntimeError, match="the sink failed"):
                await ac.get_each("ns", hashes, failing)
    assert seen == list(range(260))
    assert len(server.engine.leases) == 0
