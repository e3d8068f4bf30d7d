"""Disk tier specifics: restart recovery, leftovers, corruption, a full disk, kill -9."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
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
from kvstore.types import Workload

from .conftest import CAPACITY, block, key, meta_for, payload


def block_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.kvb"))


def temp_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.tmp"))


async def test_restart_recovers_every_block(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = DiskTier(root, CAPACITY)
    items = [
        block(i, 1000 * (i + 1), parent_hash=bytes(32) if i else None)
        for i in range(5)
    ]
    await first.put_many(items)
    await first.close()

    second = DiskTier(root, CAPACITY)
    assert isinstance(second, PersistentTier)
    metas = {m.key: m for m in await second.recover()}
    assert metas == {m.key: m for m, _ in items}  # meta fields round-trip
    for m, data in items:
        got = metas[m.key]
        assert got.token_ids == m.token_ids and got.session_id == m.session_id
        assert got.workload is Workload.CHAT
        assert bytes(await second.get(m.key)) == data
    assert second.used_bytes == sum(m.size for m, _ in items)
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
    await second.close()


async def test_leftover_temp_file_is_removed_and_not_served(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = DiskTier(root, CAPACITY)
    meta, data = block(1, 2000)
    await first.put(meta, data)
    await first.close()
    [path] = block_files(root)
    # What a kill -9 between write and rename leaves: a complete-looking temp file.
    leftover = path.with_name(f".{key(2).block_hash.hex()}.x.kvb.deadbeef.tmp")
    leftover.write_bytes(path.read_bytes())

    second = DiskTier(root, CAPACITY)
    assert [m.key for m in await second.recover()] == [meta.key]
    assert temp_files(root) == []
    assert not await second.contains(key(2))
    await second.close()


async def test_corrupt_payload_byte_is_detected_and_removed(disk: DiskTier) -> None:
    meta, data = block(1, 4096)
    await disk.put(meta, data)
    [path] = block_files(disk.root)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(raw)
    with pytest.raises(DataCorruption):
        await disk.get(meta.key)
    assert not path.exists()
    assert not await disk.contains(meta.key)
    assert disk.used_bytes == 0


async def test_damaged_files_are_dropped_on_recover(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = DiskTier(root, CAPACITY)
    items = [block(i, 3000) for i in range(3)]
    await first.put_many(items)
    await first.close()
    by_name = {p.name.split(".")[0]: p for p in block_files(root)}
    truncated = by_name[key(0).block_hash.hex()]
    truncated.write_bytes(truncated.read_bytes()[:-1])
    garbage = by_name[key(1).block_hash.hex()]
    garbage.write_bytes(b"not a block file")

    second = DiskTier(root, CAPACITY)
    assert [m.key for m in await second.recover()] == [key(2)]
    assert not truncated.exists() and not garbage.exists()
    assert second.used_bytes == 3000
    await second.close()


async def test_enospc_is_a_clean_refusal(disk: DiskTier, monkeypatch: pytest.MonkeyPatch) -> None:
    meta, data = block(1, 1000)
    await disk.put(meta, data)
    real_write = os.write

    def full(fd: int, buf: bytes | memoryview) -> int:
        if len(buf) > 500:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, buf)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(TierFull, match="filesystem .* is full"):
        await disk.put(*block(2, 2000))
    with pytest.raises(TierFull):  # replacing an existing block keeps the old one
        await disk.put(meta_for(meta.key, payload(9, 1000)), payload(9, 1000))
    monkeypatch.undo()
    assert temp_files(disk.root) == []
    assert disk.used_bytes == 1000
    assert bytes(await disk.get(meta.key)) == data
    assert not await disk.contains(key(2))


async def test_other_io_errors_are_unavailable(
    disk: DiskTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(TierUnavailable):
        await disk.put(*block(1, 100))
    monkeypatch.undo()
    assert temp_files(disk.root) == [] and disk.used_bytes == 0


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
        subprocess.run(["umount", str(mnt)], check=False)


async def test_real_full_filesystem(tiny_fs: Path) -> None:
    tier = DiskTier(tiny_fs / "d", 16 * CAPACITY)
    stored = []
    with pytest.raises(TierFull, match="is full"):
        for i in range(64):  # 64 x 96 KiB > the 1 MiB filesystem
            meta, data = block(i, 96 << 10)
            await tier.put(meta, data)
            stored.append((meta, data))
    assert 4 <= len(stored) < 11
    assert temp_files(tier.root) == []
    assert tier.used_bytes == sum(m.size for m, _ in stored)
    for meta, data in stored:
        assert bytes(await tier.get(meta.key)) == data
    assert await tier.delete(stored[0][0].key)
    await tier.put(*block(100, 96 << 10))  # room again after a delete
    await tier.close()


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from kvstore.tiers.disk import DiskTier
    from tests.tiers.conftest import block

    async def main():
        tier = DiskTier(Path(sys.argv[1]), 1 << 30)
        i = 0
        while True:
            await tier.put(*block(i % 50, 200_000 + i))
            i += 1
            if i == 5:
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
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    tier = DiskTier(root, 1 << 30)
    metas = await tier.recover()
    assert metas and temp_files(root) == []
    for meta in metas:
        assert len(await tier.get(meta.key)) == meta.size  # checksum verified on read
    await tier.close()


async def test_cancelled_put_still_lands_in_the_index(disk: DiskTier) -> None:
    meta, data = block(1, 50_000)
    task = asyncio.ensure_future(disk.put(meta, data))
    while disk.used_bytes == 0:  # counted as in flight once the write is in the pool
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
    again = DiskTier(root, CAPACITY)
    assert bytes(await again.get(key(1))) == current
    await again.close()


async def test_payload_not_matching_its_checksum_is_refused(disk: DiskTier) -> None:
    meta, _ = block(1, 1000)
    with pytest.raises(DataCorruption):
        await disk.put(meta, payload(2, 1000))
    assert disk.used_bytes == 0 and block_files(disk.root) == temp_files(disk.root) == []
