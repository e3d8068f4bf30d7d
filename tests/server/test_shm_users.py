"""A co-located client running as another user (the vLLM container next to the sidecar):
it maps the sidecar's segment when the segment's group lets it, and otherwise falls back
to gRPC saying why at WARNING and counting it in ``kvstore_client_fallbacks_total``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, ServerThread, test_config

SHM = Path("/dev/shm")
#: The client's user and the group it shares with the segment (or not).
CLIENT_UID = 10002
SHARED_GID = 10000
OTHER_GID = 10003

#: Becomes CLIENT_UID in the given group (after importing what it needs as root: the
#: interpreter may live where only root reads), puts and reads back one block, and
#: reports the path taken, the fallback counter and the warnings logged.
CLIENT = textwrap.dedent("""
    import asyncio, json, logging, os, sys
    from multiprocessing import resource_tracker
    from prometheus_client import REGISTRY
    import kvstore.client._common, kvstore.tiers.shm
    from kvstore.client import AsyncKVStoreClient, KVStoreClient
    from kvstore.types import BlockData

    resource_tracker.ensure_running()  # attaching registers the segment with it
    os.setgroups([])
    os.setgid(int(sys.argv[3]))
    os.setuid(int(sys.argv[2]))

    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.levelname, record.getMessage()))
    logging.getLogger("kvstore").addHandler(Keep())
    with KVStoreClient(sys.argv[1]) as c:
        shm = c.uses_shared_memory
        block = BlockData(block_hash=bytes(range(32)), parent_hash=None, token_ids=(1, 2),
                          payload=b"kv" * 4096)
        c.put("ns", [block])
        [got] = c.get("ns", [block.block_hash])

    async def aio():
        async with AsyncKVStoreClient(sys.argv[1]) as a:
            return await a.uses_shared_memory()
    aio_shm = asyncio.run(aio())
    counts = {s.labels["reason"]: s.value for m in REGISTRY.collect()
              if m.name == "kvstore_client_fallbacks" for s in m.samples
              if s.name.endswith("_total") and s.value}
    print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "shm": shm, "aio_shm": aio_shm,
                      "fallbacks": counts,
                      "same": got is not None and bytes(got.payload) == block.payload,
                      "warnings": [m for lvl, m in records if lvl == "WARNING"]}))
""")


needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="switching the client to another uid needs root")


def run_client(address: str, gid: int) -> dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": "/tmp", "PYTHONPATH": str(REPO),
           "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, address, str(CLIENT_UID), str(gid)], env=env, cwd="/",
        capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    result: dict[str, Any] = json.loads(out.stdout)
    assert result["uid"] == CLIENT_UID and result["gid"] == gid and result["same"]
    return result


def start(tmp_path: Path, **dram: str) -> ServerThread:
    return ServerThread(test_config(tmp_path / "data", dram={"capacity": "8MiB", **dram}))


@needs_root
def test_a_client_of_the_segments_group_maps_it(tmp_path: Path) -> None:
    srv = start(tmp_path, segment_mode="0660", segment_group=str(SHARED_GID))
    try:
        [(name, _)] = srv.engine.tiers["dram"].unwrap().segments()
        st = (SHM / name).stat()
        assert (st.st_mode & 0o777, st.st_gid) == (0o660, SHARED_GID)
        got = run_client(srv.address, SHARED_GID)
        assert got["shm"] is True and got["aio_shm"] is True
        assert got["fallbacks"] == {} and got["warnings"] == []
    finally:
        srv.stop()


@needs_root
@pytest.mark.parametrize("dram", [
    {},  # the default: 0600, the server's user only
    {"segment_mode": "0660", "segment_group": str(SHARED_GID)},  # a group the client is not in
], ids=["owner-only", "other-group"])
def test_a_client_the_segment_refuses_falls_back_with_a_warning_and_a_count(
        tmp_path: Path, dram: dict[str, str]) -> None:
    srv = start(tmp_path, **dram)
    try:
        got = run_client(srv.address, OTHER_GID)
    finally:
        srv.stop()
    assert got["shm"] is False  # and the put / get above went over gRPC
    assert got["aio_shm"] is False
    assert got["fallbacks"] == {"permission": 2.0}  # the blocking client, then the async one
    assert len(got["warnings"]) == 2
    for warning in got["warnings"]:
        assert "using gRPC" in warning and "(permission)" in warning
        assert f"uid {CLIENT_UID}" in warning and "dram.segment_mode" in warning


def test_a_co_located_client_of_a_server_without_dram_says_so(
        server_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    from prometheus_client import REGISTRY

    from kvstore.client import KVStoreClient

    def count() -> float:
        value = REGISTRY.get_sample_value("kvstore_client_fallbacks_total",
                                          {"reason": "no_segments"})
        return value or 0.0

    srv = server_factory(dram={"enabled": False})
    before = count()
    with caplog.at_level("WARNING", logger="kvstore.client.probe"), \
            KVStoreClient(srv.address) as c:
        assert not c.uses_shared_memory
    assert count() == before + 1
    assert any("(no_segments)" in r.getMessage() and "dram.enabled = false" in r.getMessage()
               for r in caplog.records if r.levelname == "WARNING")
