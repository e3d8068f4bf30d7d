"""``scripts/gpu_check.sh`` in its CPU form (``--dry``): the GPU check's steps (unit
tests on the device path, the transfer benchmark through a real sidecar, the report)
run here on CPU tensors, so the script is known to work before a GPU is lent."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_gpu_check_dry_runs_every_step_on_cpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (tmp_path / "gpu_check.md").read_text()
    assert "gpu_check passed" in report and "device cpu" in report
    assert " passed" in report.split("== unit tests on cpu")[1]
    rows = [ln for ln in report.splitlines() if ln.startswith("| LB")]
    assert [r.split("|")[1].strip() for r in rows] == ["LBHNC", "LBNHC"], report
    assert (tmp_path / "gpu_check_bench.jsonl").read_text().count('"layout"') == 2
