"""``scripts/gpu_check.sh`` in its CPU form (``--dry``): the GPU check's steps (unit
tests on the device path, the transfer benchmark through a real sidecar, the report)
run here on CPU tensors, so the script is known to work before a GPU is lent; and its
verdict (``scripts/gpu_check_eval.py``) on fabricated step outputs: a missed target or
an abort fails it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

EVAL = REPO / "scripts" / "gpu_check_eval.py"
JUNIT_OK = '<testsuites><testsuite tests="12" skipped="1" failures="0" errors="0"/></testsuites>'


def _row(load: float, save: float, device: str = "cuda") -> str:
    return json.dumps({
        "device": device, "layout": "LBNHC", "dtype": "bfloat16", "blocks": 512, "mib": 1024.0,
        "h2d_gbps": 50.0, "d2h_gbps": 50.0, "memcpy_gbps": 20.0, "load_gbps": 50.0 * load,
        "save_gbps": 50.0 * save, "load_vs_baseline": load, "save_vs_baseline": save})


def _fabricate(work: Path, pytest_rc: int = 0, junit: str | None = JUNIT_OK,
               benches: tuple[tuple[int, str | None], ...] = ((0, _row(0.9, 0.8)),)) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "pytest.rc").write_text(f"{pytest_rc}\n")
    if junit is not None:
        (work / "junit.xml").write_text(junit)
    (work / "bench.status").write_text(
        "".join(f"{rc} --layout LBNHC --shape {i}\n" for i, (rc, _) in enumerate(benches)))
    (work / "bench.jsonl").write_text("".join(row + "\n" for _, row in benches if row))
    return work


def _evaluate(work: Path, mode: str = "device") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EVAL), str(work), "--mode", mode],
                          capture_output=True, text=True, timeout=60)


def test_gpu_check_verdict_passes_when_every_step_ran_and_targets_are_met(
        tmp_path: Path) -> None:
    proc = _evaluate(_fabricate(tmp_path, benches=((0, _row(0.9, 0.8)), (0, _row(0.7, 0.71)))))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "load vs pinned H2D: worst 70% (target >= 70%)" in proc.stdout
    assert "FAILED" not in proc.stdout


@pytest.mark.parametrize(("load", "save", "missed"), [
    (0.69, 0.9, "load 69% of pinned H2D < 70%"),
    (0.9, 0.4, "save 40% of pinned D2H < 70%"),
    (float("nan"), 0.9, "load nan% of pinned H2D"),
])
def test_gpu_check_verdict_fails_on_a_missed_target(tmp_path: Path, load: float, save: float,
                                                    missed: str) -> None:
    proc = _evaluate(_fabricate(tmp_path, benches=((0, _row(0.9, 0.9)), (0, _row(load, save)))))
    assert proc.returncode == 1, proc.stdout
    assert f"FAILED: target missed: {missed}" in proc.stdout


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"pytest_rc": 134}, "pytest aborted (rc 134)"),  # every test passed, then SIGABRT
    ({"pytest_rc": 1, "junit": JUNIT_OK.replace('failures="0"', 'failures="2"')},
     "2 failed or errored"),
    ({"pytest_rc": 139, "junit": None}, "no junit report"),  # crashed mid-run
    ({"benches": ((0, _row(0.9, 0.9)), (134, _row(0.9, 0.9)))}, "bench aborted (rc 134)"),
    ({"benches": ((0, _row(0.9, 0.9)), (1, None))}, "bench failed (rc 1)"),
    ({"benches": ((0, None),)}, "1 runs ended well but only 0 rows"),
    ({"benches": ((0, _row(0.9, 0.9, device="cpu")),)}, "measured off the GPU"),
])
def test_gpu_check_verdict_fails_on_an_abort_or_a_crash(tmp_path: Path, kwargs: dict[str, Any],
                                                        says: str) -> None:
    proc = _evaluate(_fabricate(tmp_path, **kwargs))
    assert proc.returncode == 1, proc.stdout
    assert says in proc.stdout, proc.stdout


def test_gpu_check_verdict_dry_reports_ratios_without_enforcing_them(tmp_path: Path) -> None:
    work = _fabricate(tmp_path, benches=((0, _row(0.1, 0.1, device="cpu")),))
    proc = _evaluate(work, mode="dry")
    assert proc.returncode == 0, proc.stdout
    assert "| 10% | 10% |" in proc.stdout and "not enforced" in proc.stdout
    (work / "pytest.rc").write_text("134\n")  # an abort fails the dry run too
    assert _evaluate(work, mode="dry").returncode == 1


@pytest.mark.slow
@pytest.mark.timeout(600)
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
