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


class _AheadSink:
    """A sink that, at the start of each batch but the last, waits (up to 10 s) until the
    server has counted the next batch's Acquire too, and records whether it came: a
    read that sends the next Acquire ahead gets it while this batch is read. Checks
    each payload against the block stored."""

    def __init__(self, server: Any, blocks: list[Any], batch: int) -> None:
        self.server, self.blocks, self.batch = server, blocks, batch
        self.before = server.engine.stats.gets
        self.ahead: list[bool] = []

    def __call__(self, i: int, payload: bytes | bytearray | memoryview) -> int:
        import time

        if i % self.batch == 0 and i + self.batch < len(self.blocks):
            # (blocking this thread, and the asyncio client's loop: the request went out before)
            acquires = self.before + i // self.batch + 2
            deadline = time.monotonic() + 10
            while self.server.engine.stats.gets < acquires and time.monotonic() < deadline:
                time.sleep(0.005)
            self.ahead.append(self.server.engine.stats.gets >= acquires)
        return len(payload) if bytes(payload) == bytes(self.blocks[i].payload) else 0


def test_the_next_acquire_is_in_flight_while_a_batch_is_read(server: Any) -> None:
    """A read longer than one Acquire (READ_BATCH blocks) sends the next batch's
    Acquire before the sink has taken the first batch (the server pins and places
    the next batch while this one is copied); every block still reaches its index."""
    from kvstore.client._common import READ_BATCH

    n = 2 * READ_BATCH + 10
    blocks = make_chain(n, 2_000, seed=8)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(server.address, shared_memory=True) as c:
        c.put("ns", blocks)
        sink = _AheadSink(server, blocks, READ_BATCH)
        assert c.get_each("ns", hashes, sink) == [2_000] * n
        assert sink.ahead == [True, True]
        buffers = [bytearray(2_000) for _ in blocks]
        assert c.get_into("ns", hashes, buffers) == [2_000] * n
        assert buffers == [bytearray(b.payload) for b in blocks]
    assert len(server.engine.leases) == 0


@pytest.mark.parametrize("blocking", [True, False], ids=["sync", "async"])
async def test_a_sink_that_fails_ends_the_lease_taken_ahead(server: Any, blocking: bool
                                                            ) -> None:
    """The sink raises in the first of three batches: the lease of the batch acquired
    ahead ends with the call too (not at its expiry, its blocks pinned until then)."""
    from kvstore.client._common import READ_BATCH

    blocks = make_chain(3 * READ_BATCH, 500, seed=9)

    def failing(i: int, payload: bytes | bytearray | memoryview) -> int:
        if i == 10:
            raise RuntimeError("the sink failed")
        return len(payload)

    hashes = [b.block_hash for b in blocks]
    if blocking:
        with KVStoreClient(server.address, shared_memory=True) as c:
            c.put("ns", blocks)
            with pytest.raises(RuntimeError, match="the sink failed"):
                c.get_each("ns", hashes, failing)
            assert len(server.engine.leases) == 0 and not server.engine.leases.pins
    else:
        async with AsyncKVStoreClient(server.address, shared_memory=True) as ac:
            await ac.put("ns", blocks)
            with pytest.raises(RuntimeError, match="the sink failed"):
                await ac.get_each("ns", hashes, failing)
            assert len(server.engine.leases) == 0 and not server.engine.leases.pins


@pytest.mark.parametrize("size", [1_000, 40_000, 200_000])
def test_copy_bytes_copies_every_size(size: int) -> None:
    """Above UNLOCKED_COPY_BYTES the copy is numpy's (it lets go of the GIL), below it a
    slice assignment: the same bytes either way, into any writable buffer."""
    import numpy as np

    from kvstore.client._common import UNLOCKED_COPY_BYTES, copy_bytes, copy_into
    from kvstore.errors import InvalidArgument

    assert 1_000 < UNLOCKED_COPY_BYTES < 40_000
    src = bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8))
    for unlocked in (True, False):
        for dst in (bytearray(size), np.zeros(size, np.uint8),
                    np.zeros(size // 4 + 1, np.float32)):
            assert copy_into(dst, src, unlocked) == size
            assert memoryview(dst).cast("B")[:size].tobytes() == src
        view = memoryview(bytearray(size + 8))
        copy_bytes(view[4:4 + size], memoryview(src), unlocked)
        assert view[4:4 + size].tobytes() == src and view[:4].tobytes() == bytes(4)
    with pytest.raises(InvalidArgument, match="too small"):
        copy_into(bytearray(size - 1), src)


async def test_async_reads_send_the_next_acquire_before_reading(server: Any) -> None:
    """The asyncio client's read sends the next batch's Acquire before its copies hold
    the loop: the server has it while the sink takes the first batch."""
    from kvstore.client._common import READ_BATCH

    n = 2 * READ_BATCH + 5
    blocks = make_chain(n, 2_000, seed=10)
    async with AsyncKVStoreClient(server.address, shared_memory=True) as c:
        await c.put("ns", blocks)
        sink = _AheadSink(server, blocks, READ_BATCH)
        assert await c.get_each("ns", [b.block_hash for b in blocks], sink) == [2_000] * n
        assert sink.ahead == [True, True]
        got = await c.get("ns", [b.block_hash for b in blocks])
        assert [b.payload for b in got] == [b.payload for b in blocks]
    assert len(server.engine.leases) == 0


def test_an_unlocked_copy_lets_another_thread_run() -> None:
    """What ``unlocked`` is for: while a large copy runs, a thread of the same process
    (the client's call thread with a reply to take) gets the interpreter."""
    import threading

    from kvstore.client._common import copy_bytes

    size = 64 * 2**20
    src, dst = bytes(size), memoryview(bytearray(size))
    ticks = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        ran = []
        for _ in range(5):
            before = ticks[0]
            copy_bytes(dst, src, unlocked=True)
            ran.append(ticks[0] - before)
    finally:
        stop.set()
        thread.join()
    assert max(ran) > 0, ran
