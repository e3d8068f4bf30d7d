"""PNG plots of a profile (matplotlib, Agg): the (input, output) scatter with the
quadrants named, hit rate against capacity per policy with Belady, arrivals
per minute over time, and the gap histograms per hint kind."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstore.profile.arrival import bin_counts
from kvstore.profile.model import Curve, Profile, Row
from kvstore.profile.quadrants import AGENT_INPUT, LONG_INPUT, LONG_OUTPUT, QUADRANTS
from kvstore.profile.sessions import UNLABELLED, gap_order

__all__ = ["write_plots"]

#: Points drawn in the scatter at most (a seeded sample beyond).
MAX_POINTS = 50_000
#: Gaps shorter than this are drawn at it (log axis).
_MIN_GAP_S = 0.1


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _scatter(rows: Sequence[Row], title: str, path: Path) -> None:
    plt = _plt()
    pts = [(r.input_tokens, r.output_tokens) for r in rows
           if r.output_tokens is not None and r.input_tokens > 0 and r.output_tokens > 0]
    if len(pts) > MAX_POINTS:
        pts = random.Random(0).sample(pts, MAX_POINTS)
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=3, alpha=0.3, linewidths=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [p[0] for p in pts] or [1]
    ys = [p[1] for p in pts] or [1]
    x0, x1 = min(min(xs), LONG_INPUT // 8), max(max(xs), AGENT_INPUT * 4)
    y0, y1 = min(min(ys), LONG_OUTPUT // 16), max(max(ys), LONG_OUTPUT * 8)
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    for x in (LONG_INPUT, AGENT_INPUT):
        ax.axvline(x, color="k", lw=0.8, ls="--", ymax=_frac(LONG_OUTPUT, y0, y1)
                   if x == AGENT_INPUT else 1.0)
    ax.axhline(LONG_OUTPUT, color="k", lw=0.8, ls="--")
    ymid_lo = math.sqrt(y0 * LONG_OUTPUT)
    ymid_hi = math.sqrt(LONG_OUTPUT * y1)
    labels = {"chat": (math.sqrt(x0 * LONG_INPUT), ymid_lo),
              "rag": (math.sqrt(LONG_INPUT * AGENT_INPUT), ymid_lo),
              "agent": (math.sqrt(AGENT_INPUT * x1), ymid_lo),
              "reasoning": (math.sqrt(x0 * LONG_INPUT), ymid_hi),
              "batch": (math.sqrt(LONG_INPUT * x1), ymid_hi)}
    for q, (lx, ly) in labels.items():
        ax.text(lx, ly, QUADRANTS[q], ha="center", va="center", fontsize=10, weight="bold",
                color="tab:red", alpha=0.8)
    ax.set_xlabel("input tokens")
    ax.set_ylabel("output tokens")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def _frac(y: float, y0: float, y1: float) -> float:
    return (math.log(y) - math.log(y0)) / (math.log(y1) - math.log(y0))


def _capacity(curve: Curve, prof: Profile, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pol in curve.policies():
        pts = curve.of(pol)
        style = {"color": "k", "ls": "--", "marker": "x"} if pol == "belady" else {"marker": "o"}
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts],
                label="belady (offline bound)" if pol == "belady" else pol, **style)
    ax.axhline(100 * curve.unbounded_hit_rate, color="grey", lw=0.8, ls=":",
               label="unbounded cache")
    ax.set_xscale("log")
    ax.set_xlabel(f"capacity (blocks of {prof.block_tokens} tokens)")
    ax.set_ylabel("prefix hit rate (%)")
    ax.set_title(f"hit rate vs capacity: {Path(prof.source).name}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def _arrival(rows: Sequence[Row], title: str, path: Path) -> None:
    plt = _plt()
    counts = bin_counts([r.t_s for r in rows], 60.0)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([i / 60 if len(counts) > 180 else i for i in range(len(counts))], counts, lw=1)
    ax.set_xlabel("hours from the first request" if len(counts) > 180
                  else "minutes from the first request")
    ax.set_ylabel("requests per minute")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def _gaps(rows: Sequence[Row], title: str, path: Path) -> bool:
    by: dict[str, list[float]] = {}
    last: dict[str, Row] = {}
    for r in rows:
        if r.session is None:
            continue
        prev = last.get(r.session)
        if prev is not None:
            by.setdefault(prev.after or UNLABELLED, []).append(max(r.t_s - prev.t_s, _MIN_GAP_S))
        last[r.session] = r
    if not by:
        return False
    plt = _plt()
    lo = min(min(v) for v in by.values())
    hi = max(max(v) for v in by.values())
    edges = [lo * (hi / lo) ** (i / 40) for i in range(41)] if hi > lo else [lo * 0.9, lo * 1.1]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind in gap_order(by):
        vals = by[kind]
        ax.hist(vals, bins=edges, histtype="step", lw=1.5, label=f"after {kind} ({len(vals):,})")
    ax.set_xscale("log")
    ax.set_xlabel(f"gap to the session's next call (s; under {_MIN_GAP_S:g} s drawn at "
                  f"{_MIN_GAP_S:g} s)")
    ax.set_ylabel("gaps")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
    return True


def write_plots(prof: Profile, rows: Sequence[Row], directory: str | Path) -> list[Path]:
    """Write the plots that have data into ``directory``; returns their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    name = Path(prof.source).name
    written = []
    path = out / "lengths.png"
    _scatter(rows, f"(input, output) per request: {name}", path)
    written.append(path)
    if prof.curve is not None:
        path = out / "capacity.png"
        _capacity(prof.curve, prof, path)
        written.append(path)
    path = out / "arrival.png"
    _arrival(rows, f"arrivals: {name}", path)
    written.append(path)
    path = out / "gaps.png"
    if _gaps(rows, f"gap after a call, by what followed it: {name}", path):
        written.append(path)
    return written
