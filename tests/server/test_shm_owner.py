"""DRAM segment ownership across restarts: a restarted server reclaims its predecessor's
segment whatever its pid (a container's server is PID 1 at every start), and never
removes a live server's segment."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvstore.client import KVStoreClient
from kvstore.errors import TierUnavailable
from kvstore.tiers import shmowner
from kvstore.tiers.dram import DramTier
from kvstore.tiers.shmowner import SegmentOwner, reap_stale_segments
from tests.conftest import ServerThread, free_port, test_config

SHM = Path("/dev/shm")


def segments(prefix: str) -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith(prefix + "_")}


@pytest.fixture
def prefix() -> Any:
    """A segment prefix of this test only (other tests' segments never interfere)."""
    name = f"kvown{os.getpid()}x{time.monotonic_ns() % 10**9}"
    yield name
    for seg in segments(name):
        (SHM / seg).unlink(missing_ok=True)


def forge_segment(name: str, size: int = 1 << 20) -> None:
    """A segment as a dead server leaves it: the file, no owner holding its flock."""
    fd = os.open(SHM / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    os.close(fd)


def test_a_forged_segment_of_this_pid_from_a_previous_instance_is_reclaimed(
        tmp_path: Path, prefix: str) -> None:
    # The previous instance had this very pid (PID 1 in a container, restarted) and
    # recorded its segment in the data directory before it died.
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    old = f"{prefix}_{os.getpid()}_cafebabe_0"
    forge_segment(old)
    (data / "dram.segments").write_text(old + "\n")
    srv = ServerThread(test_config(data, dram={"segment_prefix": prefix, "capacity": "4MiB"}))
    try:
        now = segments(prefix)
        assert old not in now, "the predecessor's segment leaked next to the new one"
        assert len(now) == 1
        [(mine, _)] = srv.engine.tiers["dram"].unwrap().segments()
        assert now == {mine}
        assert (data / "dram.segments").read_text().split() == [mine]
    finally:
        srv.stop()
    assert segments(prefix) == set()  # a clean stop leaves nothing
    assert (data / "dram.segments").read_text() == ""


def _unshare() -> str:
    exe = shutil.which("unshare")
    if exe is None or os.geteuid() != 0:
        pytest.skip("needs root and util-linux unshare (a PID namespace per server)")
    probe = subprocess.run([exe, "--pid", "--fork", "--kill-child", "true"],
                           capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here: {probe.stderr.decode().strip()}")
    return exe


def _serve_as_pid_1(unshare: str, data: Path, prefix: str, port: int) -> subprocess.Popen[bytes]:
    kvstore = shutil.which("kvstore", path=str(Path(sys.executable).parent)) or "kvstore"
    env = {**os.environ, "KVSTORE_DRAM__SEGMENT_PREFIX": prefix,
           "KVSTORE_DRAM__CAPACITY": "4MiB", "KVSTORE_DISK__CAPACITY": "64MiB",
           "KVSTORE_EVENTS__ENDPOINT": "tcp://127.0.0.1:*",
           "KVSTORE_EVENTS__REPLAY_ENDPOINT": "tcp://127.0.0.1:*"}
    log = open(data.parent / f"server-{port}.log", "ab")  # noqa: SIM115 - the child's
    with log:
        proc = subprocess.Popen(
            [unshare, "--pid", "--fork", "--kill-child", kvstore, "serve", "--listen",
             f"127.0.0.1:{port}", "--data-dir", str(data), "--metrics-port", "0"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, (data.parent / f"server-{port}.log").read_text()
        try:
            with KVStoreClient(f"127.0.0.1:{port}", timeout=1.0, shared_memory=False) as c:
                c.stats()
            return proc
        except Exception:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError("kvstore serve did not start")


def _server_pid(unshare: subprocess.Popen[bytes]) -> int:
    """The host pid of the server unshare forked (PID 1 of its namespace)."""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
    return int(children[0])


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()]


def _signal_server(unshare: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the server itself (unshare ignores SIGTERM) and wait for both to end.

    SIGKILL takes the server's children first (its multiprocessing resource tracker):
    the whole container dies at once, and a tracker that outlived the server by a moment
    would unlink the segment it was told of, hiding the leak this test is about."""
    server = _server_pid(unshare)
    if sig == signal.SIGKILL:
        for child in _children(server):
            os.kill(child, signal.SIGKILL)
    os.kill(server, sig)
    unshare.wait(20)


def test_a_sidecar_restarted_as_pid_1_after_kill9_reclaims_its_segment(
        tmp_path: Path, prefix: str) -> None:
    unshare = _unshare()
    data, port = tmp_path / "data", free_port()
    first = _serve_as_pid_1(unshare, data, prefix, port)
    try:
        [old] = segments(prefix)
        _signal_server(first, signal.SIGKILL)
        assert segments(prefix) == {old}  # kill -9 leaves the segment behind
        second = _serve_as_pid_1(unshare, data, prefix, port)
        try:
            now = segments(prefix)
            assert old not in now and len(now) == 1, f"{old} leaked next to {now}"
        finally:
            _signal_server(second, signal.SIGTERM)
    finally:
        if first.poll() is None:
            first.kill()  # --kill-child: the server dies with it
            first.wait(10)
    assert segments(prefix) == set()


def test_a_live_servers_segment_is_never_reaped(
        tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shmowner, "CREATION_GRACE_S", 0.0)  # judge by the flock alone
    dead = f"{prefix}_0badf00d0badf00d_0"
    forge_segment(dead)
    a = ServerThread(test_config(tmp_path / "a", dram={"segment_prefix": prefix,
                                                       "capacity": "4MiB"}))
    try:
        [(live_a, _)] = a.engine.tiers["dram"].unwrap().segments()
        assert dead not in segments(prefix)  # unlocked and old enough: a dead server's
        # A second server on another data directory, same host, same prefix: its start
        # scans the same /dev/shm and leaves A's segment alone.
        b = ServerThread(test_config(tmp_path / "b", dram={"segment_prefix": prefix,
                                                           "capacity": "4MiB"}))
        try:
            [(live_b, _)] = b.engine.tiers["dram"].unwrap().segments()
            assert segments(prefix) == {live_a, live_b}
            assert reap_stale_segments(prefix) == []
            with KVStoreClient(a.address) as c:
                assert c.uses_shared_memory  # A's clients still map it
        finally:
            b.stop()
        assert segments(prefix) == {live_a}
    finally:
        a.stop()


def test_a_young_unlocked_segment_is_left_to_its_creator(prefix: str) -> None:
    young = f"{prefix}_0123456789abcdef_0"
    forge_segment(young)
    assert reap_stale_segments(prefix) == []  # its owner may not have locked it yet
    assert young in segments(prefix)


def test_two_servers_on_one_data_dir_are_refused(tmp_path: Path, prefix: str) -> None:
    first = DramTier(1 << 20, segment_prefix=prefix, owner_dir=tmp_path)
    try:
        with pytest.raises(TierUnavailable, match="in use by another kvstore server"):
            DramTier(1 << 20, segment_prefix=prefix, owner_dir=tmp_path)
        assert len(segments(prefix)) == 1  # the refused one made nothing
    finally:
        import asyncio

        asyncio.run(first.close())
    second = SegmentOwner.claim(tmp_path)  # released at close
    second.close()


def test_an_older_versions_segment_goes_only_when_its_pid_is_gone(
        prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Older versions named segments <prefix>_<pid>_<8 hex>_<n> and took no flock: a live
    # one of those (a server of that version on this host) must stay.
    monkeypatch.setattr(shmowner, "CREATION_GRACE_S", 0.0)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = f"{prefix}_{sleeper.pid}_0a1b2c3d_0"
        forge_segment(live)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait(10)
        dead = f"{prefix}_{gone.pid}_4e5f6a7b_0"
        forge_segment(dead)
        assert reap_stale_segments(prefix) == [dead]
        assert segments(prefix) == {live}
    finally:
        sleeper.kill()
        sleeper.wait(10)
