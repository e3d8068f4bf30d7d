"""The code stays ruff-clean and mypy --strict clean (STYLE.md habit 14)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists() and shutil.which(name) is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return str(path if path.exists() else shutil.which(name))


def test_ruff() -> None:
    out = subprocess.run([_tool("ruff"), "check", "--output-format", "concise", "."],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    out = subprocess.run([_tool("mypy"), "kvstore", "policies", "connectors"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
