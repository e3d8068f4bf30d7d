"""The code stays ruff-clean and mypy --strict clean (STYLE.md habit 14), and its imports
keep the layers (habit 18: import-linter, with the tools above the service)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _lint_imports() -> Any:
    _tool("lint-imports")
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import lint_imports
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return lint_imports


def test_import_layers() -> None:
    """The layers and no-cycles contracts in pyproject.toml hold (docs/ARCHITECTURE.md)."""
    out = _lint_imports().run([])
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in out.stdout, out.stdout[-3000:]


@pytest.mark.parametrize(("path", "text", "broken"), [
    # a policy (policies/, installed as kvstore.policies) reaching up into the engine
    ("policies/_upward_probe.py", "import kvstore.engine.core\n", "kvstore.policies"),
    # the engine reaching up into a tool
    ("engine/_upward_probe.py", "from kvstore.tools import harness\n", "kvstore.engine"),
])
def test_import_layers_catch_an_upward_import(path: str, text: str, broken: str) -> None:
    """The check sees the mapped folders and fails on a planted upward import."""
    out = _lint_imports().run(["--contract", "layers"], extra={path: text})
    assert out.returncode != 0, out.stdout[-3000:]
    assert f"{broken} is not allowed to import" in out.stdout, out.stdout[-3000:]


_SERVICE = ("kvstore.server.app", "kvstore.engine", "kvstore.tiers", "kvstore.events",
            "kvstore.client", "kvstore.security", "kvstore.connectors.router",
            "kvstore.connectors.lmcache.link", "kvstore.connectors.vllm.config")


def test_the_server_imports_no_tool() -> None:
    """Importing the server (and engine, tiers, events, client, connectors) loads no
    module of kvstore.tools, and no benchmark, torture or load test lives in them."""
    code = (f"import importlib, sys\nfor m in {_SERVICE!r}: importlib.import_module(m)\n"
            "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = [m for m in out.stdout.split() if m.startswith("kvstore.")]
    assert "kvstore.server.app" in loaded
    assert [m for m in loaded if m.startswith("kvstore.tools")] == []
    service = [p for p in (REPO / "kvstore").rglob("*.py") if "tools" not in p.parts]
    service += list((REPO / "connectors").rglob("*.py")) + list((REPO / "policies").rglob("*.py"))
    measuring = [str(p.relative_to(REPO)) for p in service
                 if any(w in p.stem for w in ("bench", "torture", "loadtest"))
                 or p.parent.name in ("bench", "loadtest")]
    assert measuring == [], f"measurement code inside the service: {measuring}"


def test_kvstore_serve_parses_without_loading_a_tool() -> None:
    """The ``kvstore serve`` process itself (the CLI up to the server's start) loads no
    module of kvstore.tools."""
    code = ("import sys\nfrom kvstore import cli\n"
            "cli._serve = lambda args: print(' '.join(sys.modules)) or 0\n"
            "sys.exit(cli.main(['serve', '--listen', '127.0.0.1:1']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = out.stdout.split()
    assert "kvstore.cli" in loaded
    assert [m for m in loaded if m.startswith("kvstore.") and (
        m.startswith("kvstore.tools") or any(w in m for w in ("bench", "torture", "loadtest")))
    ] == []
