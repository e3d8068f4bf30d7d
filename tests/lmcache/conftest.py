"""Fixtures for the LMCache plugin tests: the LMCache interpreter and a driver process.

LMCache pins protobuf < 7 and numpy <= 2.2.6, so it lives in its own venv
(``.venv-lmcache``, made by scripts/setup-venv.sh); its engines run in a subprocess
(``lmcache_driver.py``) that this side drives line by line, while the sidecar runs
here (in-process fixtures) or as ``kvstore serve``.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

HERE = Path(__file__).parent


def _lmcache_python() -> str | None:
    path = os.environ.get("KVSTORE_LMCACHE_PYTHON") or str(REPO / ".venv-lmcache/bin/python")
    return path if Path(path).exists() else None


@pytest.fixture(scope="session")
def lmcache_python() -> str:
    """A Python with lmcache 0.5.6 and this kvstore (scripts/setup-venv.sh makes it)."""
    path = _lmcache_python()
    if path is None:
        pytest.skip("no LMCache interpreter: run scripts/setup-venv.sh (makes .venv-lmcache) "
                    "or set KVSTORE_LMCACHE_PYTHON")
    return path


def lmcache_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONHASHSEED="0", PYTHONPATH=str(REPO), LMCACHE_LOG_LEVEL="WARNING",
               PYTHONUNBUFFERED="1")
    return env


class Driver:
    """``lmcache_driver.py`` in the LMCache venv; ``call(op, **args)`` returns its answer."""

    def __init__(self, python: str, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - a file (never a pipe nobody drains), closed in close()
        self.proc = subprocess.Popen(
            [python, str(HERE / "lmcache_driver.py")], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, env=lmcache_env(), cwd=REPO)

    def call(self, op: str, timeout: float = 120.0, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if ready:
                break
            if left <= 0:
                raise AssertionError(f"driver: {op} took over {timeout} s\n{self.log_tail()}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"driver exited ({self.proc.poll()}) during {op}\n"
                                 f"{self.log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.pop("ok"):
            raise AssertionError(f"driver: {op} failed: {answer['traceback']}\n{self.log_tail()}")
        return answer

    def log_tail(self, n: int = 6000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


@pytest.fixture
def driver(lmcache_python: str, tmp_path: Path) -> Iterator[Driver]:
    d = Driver(lmcache_python, tmp_path / "lmcache-driver.log")
    yield d
    d.close()
