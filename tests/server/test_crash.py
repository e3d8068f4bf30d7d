"""kill -9 of a real server process, then a restart on the same data dir."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from kvstore import KVStoreClient, Medium
from tests.blocks import make_chain

pytestmark = pytest.mark.slow


def _wait_on_disk(c: KVStoreClient, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = c.stats()
        if st.tier("disk").blocks >= n and st.pending_moves == 0:
            return
        time.sleep(0.1)
    raise TimeoutError(f"write-back did not reach disk: {c.stats()}")


def test_acknowledged_blocks_on_disk_survive_kill9(server_process, tmp_path):
    data = tmp_path / "data"
    srv = server_process(data_dir=data)
    blocks = make_chain(200, 256 * 1024, seed=5)
    hashes = [b.block_hash for b in blocks]
    with KVStoreClient(srv.address) as c:
        assert c.put("m", blocks) == 200
        _wait_on_disk(c, 200)
    srv.kill9()

    srv2 = server_process(data_dir=data, port=srv.port)
    with KVStoreClient(srv2.address) as c:
        r = c.lookup("m", hashes)
        assert r.num_hit == 200 and set(r.media) == {Medium.DISK}
        got = c.get("m", hashes)  # every read verifies the xxh3 checksum
        assert [g.payload if g else None for g in got] == [b.payload for b in blocks]


def _on_disk(root: Path) -> tuple[list[bytes], Path, int, Path, int]:
    """Open the disk tier offline, as a restart would: (hashes of the blocks it
    recovered, and where the first and last of them lie: segment file, offset)."""
    from kvstore.tiers.disk import DiskTier
    from kvstore.tiers.disk.index import offset_of, seg_of

    async def run() -> tuple[list[bytes], Path, int, Path, int]:
        tier = DiskTier(root, 1 << 30)
        metas = await tier.recover()
        locs = sorted(tier._map.values(), key=lambda v: (seg_of(v), offset_of(v)))
        await tier.close()
        first, last = locs[0], locs[-1]
        return ([m.key.block_hash for m in metas],
                root / f"{seg_of(first):016x}.seg", offset_of(first),
                root / f"{seg_of(last):016x}.seg", offset_of(last))

    return asyncio.run(run())


def test_kill9_mid_write_serves_nothing_half_written(server_process, tmp_path):
    data = tmp_path / "data"
    srv = server_process(data_dir=data)
    blocks = make_chain(300, 1024 * 1024, seed=6)
    with KVStoreClient(srv.address) as c:
        c.put("m", blocks)  # acknowledged in DRAM; write-back to disk in flight
    srv.kill9()

    # Format 2: damage records inside the segments the way a failing disk would: flip a
    # payload byte of one record, cut the segment holding another in the middle of it.
    on_disk, flip_seg, flip_at, cut_seg, cut_at = _on_disk(data / "disk")
    assert len(on_disk) >= 3, "some blocks should have reached disk before the kill"
    with open(flip_seg, "r+b") as f:
        f.seek(flip_at + 8192)
        byte = f.read(1)
        f.seek(flip_at + 8192)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.truncate(cut_seg, cut_at + 5000)

    srv2 = server_process(data_dir=data, port=srv.port)
    with KVStoreClient(srv2.address) as c:
        got = c.get("m", [b.block_hash for b in blocks])
    served = [(g, b) for g, b in zip(got, blocks, strict=True) if g is not None]
    assert all(g.payload == b.payload for g, b in served), "a served block differs"
    assert len(served) == len(on_disk) - 2, "every intact block, and no damaged one, is served"
    leftovers = list(Path(data / "disk").rglob("*.tmp"))
    assert leftovers == [], f"temp files left after recovery: {leftovers}"
