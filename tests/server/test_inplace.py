"""Writing and reading blocks where they lie (``put_in_place`` / ``get_in_place``).

What the vLLM connector uses to copy KV straight between its tensors and the
shared-memory slots; the same calls fall back to gRPC buffers off-host.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from kvstore import KVStoreClient
from kvstore.client import BlockSpec, SlotBuffer
from tests.blocks import make_chain


def _specs(blocks: Sequence[object]) -> list[BlockSpec]:
    return [BlockSpec(b.block_hash, b.parent_hash, tuple(b.token_ids), len(b.payload))  # type: ignore[attr-defined]
            for b in blocks]


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "grpc"])
def test_put_and_get_in_place_round_trip(server, shared_memory: bool) -> None:
    blocks = make_chain(40, 8192, seed=3)
    filled: list[int] = []

    def fill(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
        for i, slot in batch:
            assert slot.length == len(blocks[i].payload)
            view = slot.view()
            view[:] = blocks[i].payload
            view.release()
            filled.append(i)

    with KVStoreClient(server.address, shared_memory=shared_memory) as c:
        assert c.uses_shared_memory is shared_memory
        assert c.put_in_place("ns", _specs(blocks[:30]), fill, session_id="s1") == 30
        assert sorted(filled) == list(range(30))
        # Over shared memory, blocks already stored are not handed to fill again
        # (over gRPC every block is filled and the server drops the duplicates).
        filled.clear()
        assert c.put_in_place("ns", _specs(blocks), fill) == 10
        assert sorted(filled) == list(range(30 if shared_memory else 0, 40))

        got: dict[int, bytes] = {}
        whole_segment: list[bool] = []

        def read(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
            assert len(batch) <= 16
            for i, slot in batch:
                got[i] = bytes(slot.view())
                whole_segment.append(len(slot.buffer) > slot.length)

        missing = make_chain(1, 8192, seed=99)[0].block_hash
        hashes = [b.block_hash for b in blocks] + [missing]
        sizes = c.get_in_place("ns", hashes, read, max_batch=16)
        assert sizes == [8192] * 40 + [0]
        assert got == {i: b.payload for i, b in enumerate(blocks)}
        # Over shared memory the slot is addressed inside the server's segment.
        assert all(whole_segment) is shared_memory
        # The same with the leases released in the background (next batch acquired
        # while one is read): confirm() once the caller is done.
        got.clear()
        lease = c.lease_in_place("ns", hashes, read, max_batch=16)
        assert lease.sizes == sizes and got == {i: b.payload for i, b in enumerate(blocks)}
        lease.confirm()


def test_failed_fill_aborts_the_reservation(server) -> None:
    blocks = make_chain(4, 4096, seed=5)

    def broken(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
        raise RuntimeError("copy failed")

    with KVStoreClient(server.address, shared_memory=True) as c:
        with pytest.raises(RuntimeError, match="copy failed"):
            c.put_in_place("ns", _specs(blocks), broken)
        assert c.lookup("ns", [b.block_hash for b in blocks]).num_hit == 0
        # The aborted slots are free again: the same blocks store normally.
        assert c.put("ns", blocks) == 4
        assert c.get("ns", [blocks[2].block_hash])[0].payload == blocks[2].payload  # type: ignore[union-attr]


def test_failed_read_releases_the_lease(server) -> None:
    blocks = make_chain(3, 4096, seed=6)

    def broken(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
        raise RuntimeError("read failed")

    with KVStoreClient(server.address, shared_memory=True) as c:
        c.put("ns", blocks)
        with pytest.raises(RuntimeError, match="read failed"):
            c.get_in_place("ns", [b.block_hash for b in blocks], broken)
        # Released: nothing pins the blocks, so they can be deleted.
        assert c.delete("ns", [b.block_hash for b in blocks]) == 3


def test_put_in_place_halves_batches_that_do_not_fit(server_factory) -> None:
    srv = server_factory(dram={"capacity": "6MiB"}, disk={"capacity": "64MiB"})
    blocks = make_chain(24, 512 * 1024, seed=8)  # 12 MiB: one batch twice the DRAM tier

    def fill(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
        for i, slot in batch:
            view = slot.view()
            view[:] = blocks[i].payload
            view.release()

    with KVStoreClient(srv.address, shared_memory=True) as c:
        assert c.put_in_place("ns", _specs(blocks), fill) == 24
        got: dict[int, bytes] = {}

        def read(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
            for i, slot in batch:
                got[i] = bytes(slot.view())

        assert c.get_in_place("ns", [b.block_hash for b in blocks], read, max_batch=4) \
            == [512 * 1024] * 24
        assert got == {i: b.payload for i, b in enumerate(blocks)}


def test_a_lease_that_ends_while_reading(server_factory) -> None:
    """get_in_place reads again; lease_in_place's confirm() says the read is void."""
    from kvstore.errors import LeaseExpired

    srv = server_factory(server={"lease_seconds": 0.3})
    blocks = make_chain(2, 4096, seed=9)
    reads: list[int] = []

    def slow(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
        reads.append(len(batch))
        if len(reads) == 1:
            time.sleep(0.6)

    with KVStoreClient(srv.address, shared_memory=True) as c:
        c.put("ns", blocks)
        hashes = [b.block_hash for b in blocks]
        assert c.get_in_place("ns", hashes, slow) == [4096, 4096]
        assert reads == [2, 2]  # read again under a fresh lease
        reads.clear()
        lease = c.lease_in_place("ns", hashes, slow)
        assert lease.sizes == [4096, 4096] and reads == [2]
        with pytest.raises(LeaseExpired):
            lease.confirm()
        reads.clear()
        lease = c.lease_in_place("ns", hashes, lambda batch: None)
        lease.confirm()  # released in time: nothing to say


def test_a_reader_that_checks_itself_gets_the_slot_checksum_and_reports_failures(
        server_factory) -> None:
    """With ``verify=False`` each slot carries the checksum the server recorded; the
    indices ``read`` returns are misses and reported, and the server drops a copy
    only if its own check agrees (a reader cannot make it drop an intact block)."""
    import xxhash

    srv = server_factory(disk={"enabled": False})
    blocks = make_chain(3, 8192, seed=21)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(srv.address, shared_memory=True) as c:
        c.put("ns", blocks)

        def corrupt(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
            for _, slot in batch:
                slot.buffer[slot.offset + 9] ^= 0xFF

        c.get_in_place("ns", hashes[2:], corrupt, verify=False)  # unchecked write
        seen: dict[int, int | None] = {}

        def read(batch: Sequence[tuple[int, SlotBuffer]]) -> list[int]:
            failed = []
            for i, slot in batch:
                seen[i] = slot.checksum
                if xxhash.xxh3_64_intdigest(slot.view()) != slot.checksum:
                    failed.append(i)
            return [*failed, 1]  # 1 is intact: reported all the same

        assert c.get_in_place("ns", hashes, read, verify=False) == [8192, 0, 0]
        assert seen == {i: xxhash.xxh3_64_intdigest(b.payload) for i, b in enumerate(blocks)}
        assert c.lookup("ns", hashes[1:2]).num_hit == 1  # the server's check: intact, kept
        assert c.lookup("ns", hashes[2:]).num_hit == 0  # corrupt: dropped


def test_small_slots_are_hashed_as_they_are_filled(server) -> None:
    """A put of more than PARALLEL_HASH_BYTES in slots xxhash hashes holding the GIL
    is filled CACHED_FILL_BYTES at a time, each chunk hashed right after its fill (in
    cache): the checksums the commit carries are the bytes written, as a read checks."""
    from kvstore.client.inplace import (
        CACHED_FILL_BYTES,
        PARALLEL_HASH_BYTES,
        UNLOCKED_HASH_BYTES,
    )

    size = 64 * 1024
    assert size < UNLOCKED_HASH_BYTES
    n = PARALLEL_HASH_BYTES // size + 8
    blocks = make_chain(n, size, seed=12)
    calls: list[int] = []

    def fill(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
        calls.append(len(batch))
        for i, slot in batch:
            view = slot.view()
            view[:] = blocks[i].payload
            view.release()

    with KVStoreClient(server.address, shared_memory=True) as c:
        assert c.put_in_place("ns", _specs(blocks), fill) == n
        assert sum(calls) == n and max(calls) == CACHED_FILL_BYTES // size
        buffers = [bytearray(size) for _ in blocks]
        assert c.get_into("ns", [b.block_hash for b in blocks], buffers) == [size] * n
        assert buffers == [bytearray(b.payload) for b in blocks]
