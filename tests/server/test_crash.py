"""kill -9 of a real server process, then a restart on the same data dir."""

from __future__ import annotations

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


def test_kill9_mid_write_serves_nothing_half_written(server_process, tmp_path):
    data = tmp_path / "data"
    srv = server_process(data_dir=data)
    blocks = make_chain(300, 1024 * 1024, seed=6)
    with KVStoreClient(srv.address) as c:
        c.put("m", blocks)  # acknowledged in DRAM; write-back to disk in flight
    srv.kill9()

    files = sorted(p for p in (data / "disk").rglob("*") if p.is_file()
                   and not p.name.endswith(".tmp"))
    assert files, "some blocks should have reached disk before the kill"
    # Damage two files the way a failing disk would: truncate one, flip a byte in another.
    truncated, flipped = files[0], files[-1]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    raw = bytearray(flipped.read_bytes())
    raw[-100] ^= 0xFF
    flipped.write_bytes(bytes(raw))

    srv2 = server_process(data_dir=data, port=srv.port)
    with KVStoreClient(srv2.address) as c:
        got = c.get("m", [b.block_hash for b in blocks])
    served = [(g, b) for g, b in zip(got, blocks, strict=True) if g is not None]
    assert served, "blocks that reached disk are served again"
    assert all(g.payload == b.payload for g, b in served), "a served block differs"
    assert len(served) <= len(files) - 2, "the damaged files must not be served"
    leftovers = list(Path(data / "disk").rglob("*.tmp"))
    assert leftovers == [], f"temp files left after recovery: {leftovers}"
