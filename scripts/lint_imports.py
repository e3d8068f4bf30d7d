"""Run ``lint-imports`` (the ``[tool.importlinter]`` contracts in pyproject.toml) on the
package as it installs: ``policies/`` and ``connectors/`` as ``kvstore.policies`` and
``kvstore.connectors``.

import-linter's graph builder (grimp) walks the folder of the package it imports, so it
cannot see the setuptools ``package-dir`` mapping: from the repository it would find no
``kvstore.policies`` and drop every import of one. This builds that view as a tree of
symbolic links in a temporary folder (``kvstore/`` with each of the repo's ``kvstore/``
entries, plus ``policies`` and ``connectors``) and runs lint-imports on it. Arguments go
to lint-imports; the exit status is its.

    .venv/bin/python scripts/lint_imports.py [--verbose] [--contract KEY]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Folders installed under the kvstore namespace (pyproject's package-dir).
MAPPED = {"policies": "policies", "connectors": "connectors"}


def _links(folder: Path, source: Path) -> None:
    folder.mkdir()
    for entry in source.iterdir():
        if entry.name != "__pycache__":
            (folder / entry.name).symlink_to(entry)


def link_tree(where: Path, extra: dict[str, str] | None = None) -> Path:
    """``where/kvstore``: the installed package's layout, made of links into the repo.

    ``extra`` adds files (path under ``kvstore/`` -> text) without touching the repo: the
    folders on their way become real folders of links (tests plant an import with it)."""
    pkg = where / "kvstore"
    _links(pkg, REPO / "kvstore")
    for name, mapped in MAPPED.items():
        (pkg / name).symlink_to(REPO / mapped)
    for rel, text in (extra or {}).items():
        folder = pkg
        for part in Path(rel).parts[:-1]:
            folder = folder / part
            if folder.is_symlink():
                source = folder.resolve()
                folder.unlink()
                _links(folder, source)
        (folder / Path(rel).name).write_text(text)
    return where


def run(argv: list[str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports on the installed layout (plus ``extra`` files); output captured."""
    exe = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="kvstore-lint-imports-") as tmp:
        root = link_tree(Path(tmp), extra)
        env = {**os.environ, "PYTHONPATH": str(root)}
        cmd = [str(exe), str(REPO / "pyproject.toml"), "--no-cache", "--no-logo", *argv]
        return subprocess.run(cmd, cwd=root, env=env, check=False, capture_output=True,
                              text=True)


def main(argv: list[str]) -> int:
    out = run(argv)
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
