"""The one "start a real ``kvstore serve``" harness: :class:`LocalServer` and :func:`free_port`.

Every tool (benchmarks, torture, load test) and every test that needs the server as a
real process uses this, so how a server is started, awaited, killed and cleaned up is
written once. Standard library only at import time: the vLLM and LMCache venvs' scripts
import it too (the gRPC client is imported only when a readiness check asks for it).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

__all__ = ["LOOPBACK_EVENTS", "LocalServer", "dram_only_server", "free_port", "temporary_server",
           "to_toml"]

#: Event sockets on loopback with OS-chosen ports, so several servers never collide.
LOOPBACK_EVENTS = {"KVSTORE_EVENTS__ENDPOINT": "tcp://127.0.0.1:*",
                   "KVSTORE_EVENTS__REPLAY_ENDPOINT": "tcp://127.0.0.1:*"}

ConfigValue = str | int | float | bool

#: What ``kvstore serve`` says when its listen address is taken.
_BIND_FAILED = "server.listen: cannot bind"


class _PortTaken(Exception):
    """The port picked for a server was taken before the server bound it."""


def _ephemeral_low() -> int:
    """The lowest port the OS hands out to outgoing connections (Linux; else 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago, below the OS's ephemeral
    range where one is (so no client's outgoing connection takes it before the
    server binds it); the OS's own pick where none below is free."""
    low = _ephemeral_low()
    if low > 10_000:
        for port in random.sample(range(10_000, low), 32):
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def to_toml(sections: Mapping[str, Mapping[str, ConfigValue]]) -> str:
    """A flat ``[section] key = value`` TOML file (all a test config needs)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, str):
                lines.append(f'{key} = "{value}"')
            else:
                lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


#: The folder this process imported ``kvstore`` from: the default command runs the
#: server from there, so it imports the same code (``python -m`` puts its working folder
#: first on the path, before ``PYTHONPATH``: a benchmark of another tree run from this
#: one's folder ran this tree's server, and its client too when started with ``-m``).
_TREE = str(Path(__file__).resolve().parents[2])


class LocalServer:
    """``kvstore serve`` as a subprocess on loopback, on a fixed data dir and port.

    ``start`` returns once the server answers (``ready="grpc"``: a Stats call, with
    ``security`` if the server wants TLS or a token; ``"tcp"``: the port accepts), so a
    restart on the same dir and port (after :meth:`kill9`) is ``start()`` again. The log
    goes to a file, never a pipe nobody drains. ``env`` is added to this process's
    environment, minus the variables whose names start with one of ``drop_env``;
    ``config`` is written as a TOML file and passed with ``--config``.
    """

    def __init__(self, data_dir: Path | str, *, port: int | None = None,
                 env: Mapping[str, str] | None = None,
                 config: Mapping[str, Mapping[str, ConfigValue]] | None = None,
                 command: str | Sequence[str] | None = None, metrics_port: int = 0,
                 log_path: Path | None = None, loopback_events: bool = True,
                 drop_env: Sequence[str] = (), ready: Literal["grpc", "tcp"] = "grpc",
                 security: Any = None) -> None:
        self.data_dir = Path(data_dir)
        #: the port was picked here (not asked for): a first start that finds it taken
        #: meanwhile picks another
        self._picked = not port
        self.port = port or free_port()
        self.extra_env = {**(LOOPBACK_EVENTS if loopback_events else {}), **(env or {})}
        self.config = config
        #: (the default command runs from the tree this process's ``kvstore`` is in)
        self._cwd = _TREE if command is None else None
        if command is None:
            self.command = [sys.executable, "-m", "kvstore"]
        else:
            self.command = [command] if isinstance(command, str) else list(command)
        self.metrics_port = metrics_port
        self._log_given = log_path is not None
        self.log_path = log_path or self.data_dir.parent / f"server-{self.port}.log"
        self.drop_env = tuple(drop_env)
        self.ready = ready
        self.security = security
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"the server on {self.address} is not running")
        return self.proc.pid

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def start(self, timeout: float = 60.0) -> LocalServer:
        for _ in range(4):
            try:
                return self._start(timeout)
            except _PortTaken:  # only a port picked here, on its first start
                self.port = free_port()
                if not self._log_given:
                    self.log_path = self.data_dir.parent / f"server-{self.port}.log"
        raise RuntimeError(f"kvstore serve found four picked ports taken; log "
                           f"{self.log_path}:\n{self.log_tail()}")

    def _start(self, timeout: float) -> LocalServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [*self.command, "serve", "--listen", self.address, "--data-dir",
               str(self.data_dir), "--metrics-port", str(self.metrics_port)]
        if self.config:
            toml = self.data_dir.parent / f"server-{self.port}.toml"
            toml.write_text(to_toml(self.config))
            cmd += ["--config", str(toml)]
        base = {k: v for k, v in os.environ.items() if not k.startswith(self.drop_env)} \
            if self.drop_env else dict(os.environ)
        with open(self.log_path, "ab") as log:
            started_at = log.tell()
            self.proc = subprocess.Popen(cmd, env={**base, **self.extra_env}, stdout=log,
                                         stderr=subprocess.STDOUT, cwd=self._cwd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._picked and _BIND_FAILED in self._log_since(started_at):
                    raise _PortTaken
                raise RuntimeError(f"kvstore serve exited with {self.proc.returncode}; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            if self._answers():
                self._picked = False  # a restart keeps its port
                return self
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"kvstore serve did not answer on {self.address} in {timeout:g} s; "
                           f"log {self.log_path}:\n{self.log_tail()}")

    def _answers(self) -> bool:
        if self.ready == "tcp":
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False
        from kvstore.client import KVStoreClient

        try:
            with KVStoreClient(self.address, timeout=1.0, shared_memory=False,
                               security=self.security) as c:
                c.stats()
            return True
        except Exception:  # not listening yet: any error means "ask again"
            return False

    def kill9(self) -> None:
        """SIGKILL: the server dies without any goodbye, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing (a stall)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the server drains and exits), SIGKILL after ``timeout`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def temporary_server(env: Mapping[str, str] | None = None, *, security: Any = None,
                     prefix: str = "kvstore-tool-", timeout: float = 60.0
                     ) -> Iterator[LocalServer]:
    """A :class:`LocalServer` on a throwaway data dir (removed afterwards), started."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    server = LocalServer(tmp / "data", env=env, log_path=tmp / "server.log", security=security)
    try:
        server.start(timeout)
        yield server
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def dram_only_server(capacity: str, env: Mapping[str, str] | None = None, *,
                     security: Any = None) -> Iterator[str]:
    """A throwaway server with a DRAM tier of ``capacity`` and no disk (so write-back
    does not compete with what a benchmark measures); yields its address."""
    full = {"KVSTORE_DISK__ENABLED": "false", "KVSTORE_DRAM__CAPACITY": capacity, **(env or {})}
    with temporary_server(full, security=security, prefix="kvstore-bench-") as server:
        yield server.address
