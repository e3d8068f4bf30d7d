"""Disk tier specifics: restart, damage, a full disk, group commit, kills, compaction.

Format 2 (segments) replaced the one-file-per-block format on purpose: the tests
that damaged block files now damage records inside segments, footers and kill
lists (found through the tier's index).
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.errors import DataCorruption, TierFull, TierUnavailable
from kvstore.tiers.base import PersistentTier
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.disk.format import ALIGN, RECORD
from kvstore.tiers.disk.index import offset_of, seg_of
from kvstore.types import BlockKey, Workload

from .conftest import CAPACITY, block, key, meta_for, payload


def segments(root: Path, suffix: str = ".seg") -> list[Path]:
    return sorted(root.glob(f"*{suffix}"))


def where(tier: DiskTier, k: BlockKey) -> tuple[Path, int]:
    """(segment file, record offset) of a stored block."""
    ik = tier._keys.key(k)
    assert ik is not None
    loc = tier._map[ik]
    return tier.root / f"{seg_of(loc):016x}.seg", offset_of(loc)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


async def reopen(root: Path, capacity: int = CAPACITY, **kw: object) -> DiskTier:
    tier = DiskTier(root, capacity, **kw)  # type: ignore[arg-type]
    await tier.recover()
    return tier


async def test_restart_recovers_every_block_from_footers(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = DiskTier(root, CAPACITY)
    items = [block(i, 1000 * (i + 1), parent_hash=bytes(32) if i else None, num_tokens=16)
             for i in range(5)]
    await first.put_many(items)
    await first.close()
    assert segments(root) and len(segments(root, ".idx")) == len(segments(root))

    second = DiskTier(root, CAPACITY)
    assert isinstance(second, PersistentTier)
    metas = {m.key: m for m in await second.recover()}
    assert metas == {m.key: m for m, _ in items}  # every meta field round-trips
    assert second.report is not None and second.report.scanned == 0  # footers, no record read
    for m, data in items:
        assert metas[m.key].workload is Workload.CHAT
        assert bytes(await second.get(m.key)) == data
    assert second.used_bytes == sum(m.size for m, _ in items)
    again = {m.key: m for m in await second.recover()}  # later calls list the same blocks
    assert again == metas
    await second.close()


async def test_operations_recover_by_themselves(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = DiskTier(root, CAPACITY)
    meta, data = block(1, 500)
    await first.put(meta, data)
    await first.close()
    second = DiskTier(root, CAPACITY)
    assert await second.contains(meta.key)  # no explicit recover() needed
    assert second.used_bytes == 500
    got = await second.read_meta(meta.key)  # token ids come from the record on disk
    assert got.token_ids == meta.token_ids and got.checksum == meta.checksum
    await second.close()


async def test_replace_and_delete_survive_restart(tmp_path: Path) -> None:
    root = tmp_path / "d"
    tier = DiskTier(root, CAPACITY)
    for i in range(4):
        await tier.put(*block(i, 3000))
    new = payload(9, 5000)
    await tier.put(meta_for(key(1), new), new)  # replaced: the newer record wins
    assert await tier.delete(key(2))
    await tier.close()
    again = await reopen(root)
    assert {m.key for m in await again.recover()} == {key(0), key(1), key(3)}
    assert bytes(await again.get(key(1))) == new
    assert again.used_bytes == 3000 * 2 + 5000
    await again.close()


async def test_a_segment_without_footer_is_scanned_and_holes_skipped(tmp_path: Path) -> None:
    """What a crash leaves: no footer, a batch that never landed (zeros) between
    intact records, a torn record, a flipped payload byte; all of it is dropped,
    the intact records are kept, and the segment gets its footer back."""
    root = tmp_path / "d"
    tier = DiskTier(root, CAPACITY)
    items = [block(i, 20_000) for i in range(6)]
    for m, d in items:
        await tier.put(m, d)  # one batch each
    places = {m.key: where(tier, m.key) for m, _ in items}
    await tier.close()
    [seg] = segments(root)
    (root / seg.name.replace(".seg", ".idx")).unlink()
    with open(seg, "r+b") as f:
        _, hole = places[key(1)]
        f.seek(hole)
        f.write(b"\0" * 20_480)  # never written
        _, torn = places[key(3)]
        f.seek(torn + RECORD.size + 100)
        f.write(os.urandom(9000))  # half-written payload
    flip(seg, places[key(4)][1] + ALIGN + 17)

    again = await reopen(root)
    assert {m.key for m in await again.recover()} == {key(0), key(2), key(5)}
    for i in (0, 2, 5):
        assert bytes(await again.get(key(i))) == items[i][1]
    assert again.report is not None and again.report.scanned == 1
    assert again.damaged == 3  # the torn record, the flipped one, the zeroed hole
    await again.close()
    third = await reopen(root)
    assert third.report is not None and third.report.scanned == 0  # the footer was written
    assert third.blocks == 3
    await third.close()


async def test_records_past_the_end_of_a_cut_segment_are_dropped_at_restart(
    tmp_path: Path,
) -> None:
    root = tmp_path / "d"
    tier = DiskTier(root, CAPACITY)
    items = [block(i, 9000) for i in range(4)]
    for m, d in items:
        await tier.put(m, d)
    seg, last = where(tier, key(3))
    await tier.close()
    os.truncate(seg, last + 5000)  # a disk that lost the end of the file
    again = await reopen(root)
    assert again.blocks == 3 and again.damaged == 1  # not counted as stored, never a hit
    assert not await again.contains(key(3))
    await again.close()


async def test_a_damaged_footer_falls_back_to_a_scan(tmp_path: Path) -> None:
    root = tmp_path / "d"
    tier = DiskTier(root, CAPACITY)
    await tier.put_many([block(i, 7000) for i in range(5)])
    await tier.close()
    [idx] = segments(root, ".idx")
    flip(idx, idx.stat().st_size - 3)
    again = await reopen(root)
    assert again.blocks == 5 and again.report is not None and again.report.scanned == 1
    await again.close()


async def test_leftovers_and_bad_entries_are_skipped_never_stop_the_start(tmp_path: Path) -> None:
    root = tmp_path / "d"
    tier = DiskTier(root, CAPACITY)
    await tier.put_many([block(i, 2000) for i in range(3)])
    await tier.close()
    [seg] = segments(root)
    (root / "00000000000000f0.seg").mkdir()  # a directory where a segment belongs
    (root / "00000000000000f1.seg").symlink_to(root / "nowhere")  # dangling symlink
    os.mkfifo(root / "00000000000000f2.seg")  # a FIFO (opening it must not hang)
    (root / "00000000000000f3.seg").write_bytes(b"garbage header" * 400)
    os.mkfifo(root / seg.name.replace(".seg", ".kill.x"))  # an unknown entry
    (root / f"{seg.stem}.idx").unlink()
    os.mkfifo(root / f"{seg.stem}.idx")  # a FIFO where the footer belongs: scan instead
    (root / f"{seg.stem}.idx.tmp").write_bytes(b"half a footer")  # leftover, removed
    (root / "ab").mkdir()  # the previous format's directory of block files
    (root / "ab" / "ab12.0011.kvb").write_bytes(b"v1")

    again = DiskTier(root, CAPACITY)
    await asyncio.wait_for(again.recover(), 30)
    assert again.blocks == 3
    # skipped: f0, f1, f2, the unknown FIFO, the FIFO footer, the v1 files; damaged: f3
    assert again.skipped == 6 and again.damaged == 1
    assert again.startup_skipped == 7  # what the engine reports as Stats.startup_skipped
    assert not (root / f"{seg.stem}.idx.tmp").exists()
    assert not (root / "00000000000000f3.seg").exists()  # the damaged segment was dropped
    await again.put(*block(10, 100))  # new segments get ids past every name seen
    assert all(int(p.stem, 16) != 0xF3 for p in segments(root) if p.is_file())
    await again.close()


async def test_corrupt_payload_is_data_corruption_and_dropped(disk: DiskTier) -> None:
    meta, data = block(1, 4096)
    await disk.put(meta, data)
    seg, off = where(disk, meta.key)
    flip(seg, off + ALIGN + 10)  # inside the payload (the header page holds header + meta)
    with pytest.raises(DataCorruption):
        await disk.get(meta.key)
    assert not await disk.contains(meta.key)
    assert disk.used_bytes == 0 and disk.damaged == 1
    await disk.close()
    again = await reopen(disk.root)
    assert not await again.contains(meta.key)  # killed: not back after a restart
    await again.close()


async def test_enospc_is_a_clean_refusal(disk: DiskTier, monkeypatch: pytest.MonkeyPatch) -> None:
    meta, data = block(1, 1000)
    await disk.put(meta, data)
    real = os.pwrite

    def full(fd: int, buf: bytes | memoryview, offset: int) -> int:
        if len(buf) >= ALIGN and offset > 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buf, offset)

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(TierFull, match="filesystem .* is full"):
        await disk.put(*block(2, 2000))
    with pytest.raises(TierFull):  # replacing an existing block keeps the old one
        await disk.put(meta_for(meta.key, payload(9, 1000)), payload(9, 1000))
    monkeypatch.undo()
    assert disk.used_bytes == 1000
    assert bytes(await disk.get(meta.key)) == data
    assert not await disk.contains(key(2))
    await disk.put(*block(3, 500))  # room again: writes go on
    await disk.close()
    again = await reopen(disk.root)
    assert {m.key for m in await again.recover()} == {meta.key, key(3)}
    await again.close()


async def test_a_segment_that_cannot_be_preallocated_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    with pytest.raises(TierFull):  # not even room for a kill list: refused, nothing left
        await DiskTier(tmp_path / "d", CAPACITY).put(*block(1, 100))
    assert segments(tmp_path / "d") == []


async def test_other_io_errors_are_unavailable(
    disk: DiskTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    await disk.put(*block(1, 100))  # the segment exists

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(TierUnavailable):
        await disk.put(*block(2, 100))
    monkeypatch.undo()
    assert disk.used_bytes == 100 and not await disk.contains(key(2))


async def test_group_commit_shares_one_fsync_among_many_blocks(
    disk: DiskTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = 0
    real = os.fdatasync

    def counting(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    items = [block(i, 4000) for i in range(64)]
    await disk.put_many(items)
    assert 1 <= syncs <= 64 // 4, f"{syncs} fdatasyncs for 64 blocks"
    assert [bytes(b) for b in await disk.get_many([m.key for m, _ in items])] == [
        d for _, d in items]


async def test_files_and_directory_are_owner_only(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir(mode=0o755)  # made by an older version: narrowed at start
    os.chmod(root, 0o755)
    tier = DiskTier(root, 64 * CAPACITY, segment_bytes=256 << 10)
    items = [block(i, 60_000) for i in range(12)]  # several segments, some sealed
    for m, d in items:
        await tier.put(m, d)
    assert await tier.delete_many([items[0][0].key]) == 1  # a kill list too
    await tier.settle()
    await tier.close()
    files = [p for p in root.iterdir() if p.is_file()]
    assert {p.suffix for p in files} >= {".seg", ".idx", ".kill"}
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {
        p.name: 0o600 for p in files}
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    fresh = tmp_path / "a" / "b"
    other = DiskTier(fresh, CAPACITY)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    await other.close()


async def test_delete_frees_space_and_empty_segments_go(tmp_path: Path) -> None:
    root = tmp_path / "d"
    tier = DiskTier(root, 64 * CAPACITY, segment_bytes=256 << 10)
    items = [block(i, 60_000) for i in range(40)]  # ~4 records per segment
    for m, d in items:
        await tier.put(m, d)
    before = sum(p.stat().st_blocks for p in segments(root))
    n_before = len(segments(root))
    assert await tier.delete_many([m.key for m, _ in items[:32]]) == 32
    await tier.settle()
    assert len(segments(root)) < n_before  # sealed segments with nothing live are removed
    assert sum(p.stat().st_blocks for p in segments(root)) < before / 2  # holes punched
    for m, d in items[32:]:
        assert bytes(await tier.get(m.key)) == d
    await tier.close()
    again = await reopen(root, 64 * CAPACITY)
    assert {m.key for m in await again.recover()} == {m.key for m, _ in items[32:]}
    await again.close()


@pytest.mark.parametrize("can_punch", [True, False])
async def test_mostly_dead_segments_are_compacted(tmp_path: Path, can_punch: bool) -> None:
    root = tmp_path / "d"
    tier = DiskTier(root, 64 * CAPACITY, segment_bytes=512 << 10)
    tier._killer.can_punch = can_punch
    items = [block(i, 30_000) for i in range(60)]
    for m, d in items:
        await tier.put(m, d)
    keep = [items[i] for i in range(0, 60, 10)]  # one block in ten stays
    await tier.delete_many([m.key for i, (m, _) in enumerate(items) if i % 10])
    await tier.settle()
    assert tier._compactor.compacted >= 1
    assert len(segments(root)) <= 3
    for m, d in keep:
        assert bytes(await tier.get(m.key)) == d
    await tier.close()
    again = await reopen(root, 64 * CAPACITY)
    assert {m.key for m in await again.recover()} == {m.key for m, _ in keep}
    assert again.used_bytes == sum(m.size for m, _ in keep)
    await again.close()


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=False)  # still busy: detach it


async def test_real_full_filesystem(tiny_fs: Path) -> None:
    tier = DiskTier(tiny_fs / "d", 16 * CAPACITY)
    try:
        await _fill_a_full_filesystem(tier, tiny_fs)
    finally:
        await tier.close()


async def _fill_a_full_filesystem(tier: DiskTier, tiny_fs: Path) -> None:
    stored = []
    with pytest.raises(TierFull, match="is full"):
        for i in range(64):  # 64 x 96 KiB > the 1 MiB filesystem
            meta, data = block(i, 96 << 10)
            await tier.put(meta, data)
            stored.append((meta, data))
    assert 4 <= len(stored) < 11
    assert tier.used_bytes == sum(m.size for m, _ in stored)
    for meta, data in stored:
        assert bytes(await tier.get(meta.key)) == data
    assert await tier.delete(stored[0][0].key)
    await tier.put(*block(100, 96 << 10))  # room again after a delete (its hole was punched)
    await tier.close()
    again = await reopen(tiny_fs / "d", 16 * CAPACITY)
    assert again.blocks == len(stored)
    await again.close()


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from kvstore.tiers.disk import DiskTier
    from tests.tiers.conftest import block

    async def main():
        tier = DiskTier(Path(sys.argv[1]), 1 << 30, segment_bytes=4 << 20)
        i = 0
        while True:
            await tier.put_many([block(i % 50 + j, 200_000 + i + j) for j in range(4)])
            i += 4
            if i == 20:
                print("ready", flush=True)

    asyncio.run(main())
    """
)


async def test_kill_9_mid_write_leaves_only_intact_blocks(tmp_path: Path) -> None:
    root = tmp_path / "d"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    tier = DiskTier(root, 1 << 30)
    metas = await tier.recover()
    assert metas and tier.report is not None and tier.report.scanned >= 1
    for meta in metas:
        assert len(await tier.get(meta.key)) == meta.size  # checksum verified on read
    await tier.close()


async def test_cancelled_put_still_lands_in_the_index(disk: DiskTier) -> None:
    meta, data = block(1, 50_000)
    task = asyncio.ensure_future(disk.put(meta, data))
    while disk.used_bytes == 0:  # counted as in flight once the write is queued
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if await disk.contains(meta.key):
            break
        await asyncio.sleep(0.01)
    assert bytes(await disk.get(meta.key)) == data
    assert disk.used_bytes == len(data)


async def test_concurrent_puts_of_one_key_agree_with_the_file(tmp_path: Path) -> None:
    root = tmp_path / "d"
    tier = DiskTier(root, CAPACITY)
    versions = [payload(i, 10_000 + i) for i in range(6)]
    await asyncio.gather(*(tier.put(meta_for(key(1), v), v) for v in versions))
    current = bytes(await tier.get(key(1)))
    assert current in versions and tier.used_bytes == len(current)
    await tier.close()
    again = await reopen(root)
    assert bytes(await again.get(key(1))) == current
    await again.close()


async def test_payload_not_matching_its_checksum_is_refused(disk: DiskTier) -> None:
    meta, _ = block(1, 1000)
    with pytest.raises(DataCorruption):
        await disk.put(meta, payload(2, 1000))
    assert disk.used_bytes == 0 and not await disk.contains(meta.key)
    await disk.close()
    again = await reopen(disk.root)
    assert again.blocks == 0
    await again.close()


async def test_config_keys_reach_the_tier(tmp_path: Path) -> None:
    from kvstore.config import load_config
    from kvstore.errors import ConfigError
    from kvstore.server.app import build_tiers

    cfg = load_config(env={"KVSTORE_DISK__SEGMENT_SIZE": "64MiB", "KVSTORE_DISK__DIRECT_IO": "0",
                           "KVSTORE_DRAM__ENABLED": "false"},
                      overrides={"data_dir": str(tmp_path)})
    [tier] = build_tiers(cfg)
    assert isinstance(tier, DiskTier)
    assert tier._writer.segment_size == 64 << 20 and not tier._direct
    await tier.close()
    with pytest.raises(ConfigError, match="disk.segment_size"):
        load_config(env={"KVSTORE_DISK__SEGMENT_SIZE": "1000"})
