"""A real server's hardening: owner-only data files, quotas in Stats over gRPC and in
``kvstore stats``."""

from __future__ import annotations

import asyncio
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import grpc

from kvstore import KVStoreClient
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc
from tests.blocks import make_chain

KVSTORE = shutil.which("kvstore", path=str(Path(sys.executable).parent)) or "kvstore"

KiB = 1024


async def test_data_is_owner_only_and_quotas_show_in_stats(server_factory) -> None:
    srv = server_factory(quotas=[{"namespace_prefix": "a/", "dram": "64KiB"}])
    with KVStoreClient(srv.address) as c:
        await asyncio.to_thread(c.put, "a/m", make_chain(8, 16 * KiB, seed=1))
        await asyncio.to_thread(c.put, "b/m", make_chain(8, 16 * KiB, seed=2))
    await asyncio.to_thread(srv.drain)
    data = Path(srv.server.cfg.data_dir)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    disk = srv.server.cfg.disk_path
    assert stat.S_IMODE(disk.stat().st_mode) == 0o700
    files = [p for p in disk.iterdir() if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    async with grpc.aio.insecure_channel(srv.address) as ch:
        st = await kvstore_pb2_grpc.KVStoreStub(ch).Stats(pb.StatsRequest())
    (q,) = st.quotas
    assert (q.namespace_prefix, q.tier, q.limit_bytes) == ("a/", "dram", 64 * KiB)
    assert 0 < q.used_bytes <= 64 * KiB
    out = await asyncio.to_thread(
        subprocess.run, [KVSTORE, "stats", "--address", srv.address], capture_output=True,
        text=True, check=True)
    assert f"quota 'a/' in dram: {q.used_bytes:,d} / {64 * KiB:,d} bytes" in out.stdout
