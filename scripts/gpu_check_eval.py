"""The verdict of ``scripts/gpu_check.sh``: what its steps left in a work folder -> rc.

    python scripts/gpu_check_eval.py WORKDIR --mode device|dry [--target 0.7]

Reads, in WORKDIR:

- ``pytest.rc`` and ``junit.xml``: the unit tests' exit status and pytest's report;
- ``bench.status``: one line per benchmark shape, ``<rc> <shape>``;
- ``bench.jsonl``: the JSON row of every benchmark that finished.

Prints the report's verdict part (the table, each target, each failure) and exits 1
when anything failed: a failed, errored or missing test; any step that crashed,
an abort included (rc 134 after every test passed is still a crash: the process
did not end cleanly, and what it would have done after is unknown); a benchmark
without its row; and, on a GPU (``--mode device``), a save or load below
``--target`` of a pinned device-to-host / host-to-device copy of the same bytes.
On CPU (``--mode dry``) the ratios are printed, not enforced: the small dry shapes
measure the steps, not the speed. Standard library only: the GPU machine has
torch and no vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

__all__ = ["evaluate", "main"]

#: rc of a process killed by SIGABRT (``terminate called ...``, a failed assertion in C).
ABORT_RC = 134


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _junit_counts(path: Path) -> tuple[int, int] | None:
    """(tests run, failed or errored), or None when the report is missing or broken."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return None
    run = int(suite.get("tests", 0)) - int(suite.get("skipped", 0))
    bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return run, bad


def _unit_tests(work: Path) -> list[str]:
    """Failures of the unit-test step (empty: passed)."""
    rc = _read_int(work / "pytest.rc")
    counts = _junit_counts(work / "junit.xml")
    problems = []
    if rc is None:
        problems.append("unit tests: no exit status (the step did not finish)")
    elif rc == ABORT_RC:
        problems.append(f"unit tests: pytest aborted (rc {ABORT_RC}); an abort is a failure "
                        "even after the tests passed")
    elif rc != 0:
        problems.append(f"unit tests: pytest exited with {rc}")
    if counts is None:
        problems.append("unit tests: no junit report")
    else:
        run, bad = counts
        if bad:
            problems.append(f"unit tests: {bad} failed or errored")
        if run <= 0:
            problems.append("unit tests: none ran")
    return problems


def _benches(work: Path) -> tuple[list[dict[str, Any]], list[str]]:
    problems = []
    try:
        status = [ln.split(" ", 1) for ln in (work / "bench.status").read_text().splitlines()
                  if ln.strip()]
    except OSError:
        status = []
        problems.append("bench: no status (the step did not run)")
    for parts in status:
        rc = parts[0]
        shape = parts[1] if len(parts) > 1 else "?"
        if rc == str(ABORT_RC):
            problems.append(f"bench aborted (rc {ABORT_RC}): {shape}")
        elif rc != "0":
            problems.append(f"bench failed (rc {rc}): {shape}")
    try:
        rows = [json.loads(ln) for ln in (work / "bench.jsonl").read_text().splitlines()
                if ln.startswith("{")]
    except OSError:
        rows = []
    except json.JSONDecodeError as exc:
        rows = []
        problems.append(f"bench: unreadable row in bench.jsonl ({exc})")
    ok_runs = sum(1 for parts in status if parts[0] == "0")
    if len(rows) < ok_runs:
        problems.append(f"bench: {ok_runs} runs ended well but only {len(rows)} rows")
    if status and not rows:
        problems.append("bench: no measurement")
    return rows, problems


def _table(rows: list[dict[str, Any]], cuda: bool) -> list[str]:
    base = "pinned H2D / D2H GB/s" if cuda else "memcpy GB/s"
    lines = [f"| layout | dtype | blocks | MiB | save GB/s | load GB/s | {base} | save / base "
             "| load / base |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ref = (f"{float(r['h2d_gbps']):.1f} / {float(r['d2h_gbps']):.1f}" if cuda
               else f"{float(r['memcpy_gbps']):.1f}")
        lines.append(
            f"| {r['layout']} | {r['dtype']} | {r['blocks']} | {float(r['mib']):.0f} "
            f"| {float(r['save_gbps']):.2f} | {float(r['load_gbps']):.2f} | {ref} "
            f"| {float(r['save_vs_baseline']):.0%} | {float(r['load_vs_baseline']):.0%} |")
    return lines


def _targets(rows: list[dict[str, Any]], target: float) -> tuple[list[str], list[str]]:
    """(report lines, misses) of save and load against ``target`` of the pinned copies."""
    lines, misses = [], []
    for what, key, ref in (("load", "load_vs_baseline", "pinned H2D"),
                           ("save", "save_vs_baseline", "pinned D2H")):
        for r in rows:
            try:
                ratio = float(r[key])
            except (KeyError, TypeError, ValueError):
                misses.append(f"{what}: row without {key}: {r.get('layout')}")
                continue
            if not ratio >= target:  # NaN misses too
                misses.append(f"{what} {ratio:.0%} of {ref} < {target:.0%}: {r.get('layout')} "
                              f"{r.get('dtype')} {r.get('blocks')} blocks")
        worst = min((float(r.get(key, float("nan"))) for r in rows), default=float("nan"))
        lines.append(f"{what} vs {ref}: worst {worst:.0%} (target >= {target:.0%})")
    return lines, misses


def evaluate(work: Path, mode: str, target: float = 0.7) -> tuple[list[str], int]:
    """The report's verdict lines and the exit status (0: every step passed and, on a
    GPU, every target was met)."""
    problems = _unit_tests(work)
    rows, bench_problems = _benches(work)
    problems += bench_problems
    lines: list[str] = []
    cuda = bool(rows) and rows[0].get("device") == "cuda"
    if rows:
        try:
            lines += _table(rows, cuda)
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"bench: a row lacks a field ({type(exc).__name__}: {exc})")
    if mode == "device":
        if rows and not cuda:
            problems.append("bench: measured off the GPU in device mode")
        target_lines, misses = _targets(rows, target)
        lines += ["", *target_lines]
        problems += [f"target missed: {m}" for m in misses]
    elif rows:
        lines += ["", "targets not enforced in the dry run (CPU, small shapes)"]
    lines += [f"FAILED: {p}" for p in problems]
    return lines, 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--mode", choices=("device", "dry"), required=True)
    ap.add_argument("--target", type=float, default=0.7,
                    help="least save / load share of the pinned copies on a GPU")
    args = ap.parse_args(argv)
    lines, rc = evaluate(args.workdir, args.mode, args.target)
    print("\n".join(lines))
    return rc


if __name__ == "__main__":
    sys.exit(main())
