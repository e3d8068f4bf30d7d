"""DRAM tier specifics: slots, descriptors, mixed sizes, cross-process mapping."""

from __future__ import annotations

import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import xxhash

from kvstore.errors import (
    BadDescriptor,
    BlockNotFound,
    BlockTooLargeForTier,
    InvalidBlock,
    TierFull,
    TierUnavailable,
    UnknownReservation,
)
from kvstore.tiers.base import Slot, SlotTier
from kvstore.tiers.dram import DramTier
from kvstore.tiers.shm import create_segment, destroy_segment, segment_name

from .conftest import CAPACITY, block, key, meta_for, payload

SHM = Path("/dev/shm")


def test_is_a_slot_tier(dram: DramTier) -> None:
    assert isinstance(dram, SlotTier)
    [(name, size)] = dram.segments()
    assert size >= CAPACITY
    assert (SHM / name).exists()


async def test_segment_is_owner_only(dram: DramTier) -> None:
    await dram.put(*block(1, 4096))
    [(name, _)] = dram.segments()
    assert stat.S_IMODE((SHM / name).stat().st_mode) == 0o600


async def test_reserve_write_commit_locate(dram: DramTier) -> None:
    data = payload(3, 10_000)
    slot = dram.reserve(len(data))
    assert dram.used_bytes == len(data)  # a reservation counts
    dram.view(slot)[:] = data
    meta = meta_for(key(3), data)
    dram.commit(slot, meta)
    assert dram.locate(meta.key) == slot
    assert dram.used_bytes == len(data)
    got = await dram.get(meta.key)
    assert bytes(got) == data and got.readonly
    got.release()
    with pytest.raises(UnknownReservation):
        dram.commit(slot, meta)  # already committed
    with pytest.raises(UnknownReservation):
        dram.abort(slot)


async def test_get_is_zero_copy_view_of_the_slot(dram: DramTier) -> None:
    meta, data = block(1, 4096)
    await dram.put(meta, data)
    slot = dram.locate(meta.key)
    dram.view(slot)[:4] = b"ABCD"
    got = await dram.get(meta.key)
    assert bytes(got[:4]) == b"ABCD"
    got.release()


def test_abort_frees_and_ids_are_never_reused(dram: DramTier) -> None:
    first = dram.reserve(5000)
    dram.abort(first)
    assert dram.used_bytes == 0
    second = dram.reserve(5000)
    assert second.slot_id != first.slot_id
    assert second.offset == first.offset  # the space is reused, the id is not
    with pytest.raises(UnknownReservation):
        dram.view(first)


def test_unknown_and_mismatched_slots(dram: DramTier) -> None:
    meta, _ = block(1, 100)
    [(segment, _size)] = dram.segments()
    with pytest.raises(UnknownReservation):
        dram.commit(Slot(10**12, segment, 0, 100), meta)
    slot = dram.reserve(100)
    with pytest.raises(BadDescriptor):
        dram.commit(Slot(slot.slot_id, segment, slot.offset + 64, 100), meta)
    with pytest.raises(InvalidBlock):
        dram.commit(slot, block(1, 99)[0])
    dram.commit(slot, meta)


def test_reserve_limits(dram: DramTier) -> None:
    with pytest.raises(BlockTooLargeForTier):
        dram.reserve(CAPACITY + 1)
    slot = dram.reserve(CAPACITY)
    with pytest.raises(TierFull):
        dram.reserve(1)
    dram.abort(slot)
    assert dram.can_fit(CAPACITY)


def test_reserve_run_is_all_or_nothing(dram: DramTier) -> None:
    run = dram.reserve_run([1000, 2000])
    assert run is not None and [s.length for s in run] == [1000, 2000]
    assert run[1].offset > run[0].offset and dram.used_bytes == 3000
    assert dram.reserve_run([CAPACITY]) is None and dram.used_bytes == 3000
    with pytest.raises(BlockTooLargeForTier):
        dram.reserve_run([1, CAPACITY + 1])
    for slot in run:
        dram.abort(slot)
    assert dram.used_bytes == 0 and dram.can_fit(CAPACITY)


def test_descriptor_checks(dram: DramTier) -> None:
    [(segment, size)] = dram.segments()
    dram.check_descriptor(segment, 0, size)
    dram.check_descriptor(segment, size - 1, 1)
    for offset, length in [(size - 1, 2), (-1, 10), (0, 0), (size, 1), (0, size + 1)]:
        with pytest.raises(BadDescriptor):
            dram.check_descriptor(segment, offset, length)
    with pytest.raises(BadDescriptor):
        dram.check_descriptor("not-our-segment", 0, 1)
    with pytest.raises(BadDescriptor):
        dram.view(Slot(1, segment, size - 10, 64))


async def test_ranges_return_to_the_pool_and_sizes_mix(dram: DramTier) -> None:
    page = 256 << 10
    free = dram._alloc.free_bytes
    sizes = [64, 100, 4096, page - 1, page + 1, page * 3 // 2]  # small, odd, multi-page
    for i, size in enumerate(sizes):
        await dram.put(*block(i, size))
    for i, size in enumerate(sizes):
        assert bytes(await dram.get(key(i))) == payload(i, size)
    assert dram._alloc.free_bytes < free
    assert await dram.delete_many([key(i) for i in range(len(sizes))]) == len(sizes)
    assert dram._alloc.free_bytes == free and dram._alloc.free_ranges == 1  # all coalesced
    with pytest.raises(BlockNotFound):
        dram.locate(key(0))


async def test_close_unlinks_even_with_live_views(tmp_path: Path) -> None:
    tier = DramTier(CAPACITY, segment_prefix="kvtest")
    [(segment, _)] = tier.segments()
    meta, data = block(1, 1000)
    await tier.put(meta, data)
    view = await tier.get(meta.key)
    await tier.close()
    assert not (SHM / segment).exists()
    assert bytes(view) == data  # still mapped until the reader lets go
    view.release()
    with pytest.raises(TierUnavailable):
        await tier.put(meta, data)
    await tier.close()


_CHILD = textwrap.dedent(
    """
    import sys, xxhash
    from kvstore.tiers.shm import attach_segment
    name, offset, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    shm = attach_segment(name)
    view = shm.buf[offset : offset + length]
    print(xxhash.xxh3_64_hexdigest(view))
    view.release()
    shm.close()
    """
)


async def test_second_process_reads_the_slot_and_leaves_the_segment(dram: DramTier) -> None:
    meta, data = block(5, 70_000)
    await dram.put(meta, data)
    slot = dram.locate(meta.key)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, slot.segment, str(slot.offset), str(slot.length)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == xxhash.xxh3_64_hexdigest(data)
    assert "leaked" not in out.stderr, out.stderr
    assert (SHM / slot.segment).exists()
    assert bytes(await dram.get(meta.key)) == data


def test_plain_attach_would_unlink_the_owners_segment() -> None:
    """Why attach_segment exists: on 3.11 a plain SharedMemory(name) child unlinks on exit."""
    if sys.version_info >= (3, 13):
        pytest.skip("3.13+ has track=False")
    shm = create_segment(segment_name("kvtest", 9), 4096)
    try:
        child = (
            "import sys; from multiprocessing.shared_memory import SharedMemory; "
            "SharedMemory(name=sys.argv[1]).close()"
        )
        subprocess.run([sys.executable, "-c", child, shm.name], capture_output=True, timeout=60)
        assert not (SHM / shm.name).exists()
    finally:
        destroy_segment(shm)


async def test_default_pool_keeps_small_tiers_small() -> None:
    tier = DramTier(CAPACITY, segment_prefix="kvtest")
    try:
        [(_, size)] = tier.segments()
        assert CAPACITY < size <= CAPACITY + (64 << 10) + 4096
        await tier.put(*block(1, CAPACITY))
    finally:
        await tier.close()
