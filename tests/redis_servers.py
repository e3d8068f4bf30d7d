"""Real Redis servers for the tests: the shared one at 127.0.0.1:6379 (or a private one when
it is not running), private servers on free ports for fault tests, and a real Redis Cluster
(``redis-server --cluster-enabled yes`` per node plus ``redis-cli --cluster create``).

Registered as a pytest plugin by ``tests/conftest.py``. Every test gets its own key prefix
(``redis_prefix``), and the keys under it are removed afterwards.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.tools.harness import free_port

__all__ = ["RedisCluster", "RedisServer", "free_port"]

SHARED_PORT = 6379


def _need_redis() -> None:
    if not (shutil.which("redis-server") and shutil.which("redis-cli")):
        pytest.skip("redis-server / redis-cli are not installed (apt-get install redis-server)")


def _cli(port: int, *args: str, timeout: float = 5.0) -> str:
    proc = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    return proc.stdout.strip()


def ping(port: int) -> bool:
    try:
        return _cli(port, "ping", timeout=2.0) == "PONG"
    except (OSError, subprocess.TimeoutExpired):
        return False


class RedisServer:
    """One ``redis-server`` process on a free loopback port, started and stopped by a test."""

    def __init__(self, workdir: Path, *args: str, port: int = 0) -> None:
        _need_redis()
        self.port = port or free_port()
        self.workdir = workdir
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> RedisServer:
        log = open(self.workdir / f"redis-{self.port}.log", "ab")  # noqa: SIM115
        with log:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.workdir), *self.args],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start: "
                                   f"{(self.workdir / f'redis-{self.port}.log').read_text()}")
            time.sleep(0.05)
        return self

    def cli(self, *args: str) -> str:
        return _cli(self.port, *args)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing (a stall)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


class RedisCluster:
    """``masters`` (+ ``replicas`` per master) cluster nodes on loopback, created with
    ``redis-cli --cluster create``. ``cluster-require-full-coverage no``: the slots of a
    lost master fail, the others keep serving."""

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 0) -> None:
        _need_redis()
        self.nodes: list[RedisServer] = []
        for i in range(masters * (1 + replicas)):
            bus = free_port()
            self.nodes.append(RedisServer(
                workdir / f"node{i}", "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf", "--cluster-port", str(bus),
                "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
                "--cluster-replica-validity-factor", "0",
                "--cluster-allow-reads-when-down", "no"))
        self.replicas = replicas

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    def start(self, timeout: float = 60.0) -> RedisCluster:
        for n in self.nodes:
            n.start()
        proc = subprocess.run(
            ["redis-cli", "--cluster", "create", *self.addresses, "--cluster-replicas",
             str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed:\n{proc.stdout}{proc.stderr}")
        self.wait_ok(timeout)
        return self

    def alive(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def state_ok(self) -> bool:
        """Every live node says ok, and every replica has synced with its master."""
        for n in self.alive():
            if "cluster_state:ok" not in n.cli("cluster", "info"):
                return False
            info = n.cli("info", "replication")
            if "role:slave" in info and "master_link_status:up" not in info:
                return False
        return True

    def wait_ok(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.state_ok():
            if time.monotonic() > deadline:
                raise TimeoutError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.1)

    def masters(self) -> list[RedisServer]:
        return [n for n in self.alive() if "role:master" in n.cli("info", "replication")]

    def master_of(self, key: bytes) -> RedisServer:
        slot = int(self.alive()[0].cli("cluster", "keyslot", key.decode()))
        for n in self.masters():
            for line in n.cli("cluster", "nodes").splitlines():
                parts = line.split()
                if "myself" not in parts[2]:
                    continue
                for rng in parts[8:]:
                    lo, _, hi = rng.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        return n
        raise LookupError(f"no live master serves slot {slot}")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def delete_prefix(ports: list[int], prefix: str) -> None:
    """Remove every key under ``prefix`` from these servers (cluster nodes one by one)."""
    import redis

    for port in ports:
        with contextlib.suppress(Exception), redis.Redis(host="127.0.0.1", port=port) as r:
            for name in r.scan_iter(match=f"{prefix}:*", count=1000):
                with contextlib.suppress(Exception):
                    r.unlink(name)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shared Redis at 127.0.0.1:6379 (``.ci/run`` starts it), or, when nothing answers
    there, a private server for this session."""
    _need_redis()
    if ping(SHARED_PORT):
        yield f"redis://127.0.0.1:{SHARED_PORT}/0"
        return
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real 3-master Redis Cluster on free loopback ports, for the whole session."""
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A key prefix of this test's own; its keys are removed afterwards wherever they went."""
    prefix = f"kvtest-{uuid.uuid4().hex[:12]}"
    yield prefix
    ports = [SHARED_PORT]
    if "redis_cluster" in request.fixturenames:
        ports = [n.port for n in request.getfixturevalue("redis_cluster").alive()]
    elif "redis_url" in request.fixturenames:
        ports = [int(request.getfixturevalue("redis_url").rsplit(":", 1)[1].split("/")[0])]
    delete_prefix(ports, prefix)
