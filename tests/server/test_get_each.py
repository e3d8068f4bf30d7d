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
