"""Result tables, JSON and the hit-rate-vs-capacity plot (matplotlib, Agg)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvstore.replay.driver import ReplayResult
from kvstore.replay.served import SIDECAR_TIERS, ServedResult

__all__ = ["format_served_table", "format_table", "plot_hit_rates", "write_json"]


def write_json(results: Sequence[ReplayResult | ServedResult], belady: Mapping[int, float],
               path: str | Path, meta: Mapping[str, object]) -> None:
    doc = {
        "meta": dict(meta),
        "results": [r.to_json() for r in results],
        "belady": {str(k): v for k, v in sorted(belady.items())},
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def format_table(results: Sequence[ReplayResult], belady: Mapping[int, float]) -> str:
    tiers = list(dict.fromkeys(t for r in results for t in r.tiers))  # every run's tiers
    head = ["policy", *[f"{t} blocks" for t in tiers], "hit rate",
            *[f"from {t}" for t in tiers], "GB moved", "prefill s saved"]
    rows = [head]
    for r in results:
        rows.append([
            r.policy, *[str(r.tiers.get(t, 0)) for t in tiers], f"{100 * r.hit_rate:.2f}%",
            *[f"{100 * r.hit_rate_by_tier.get(t, 0.0):.2f}%" for t in tiers],
            f"{sum(r.bytes_moved.values()) / 1e9:.1f}", f"{r.prefill_s_saved:.0f}",
        ])
    for cap, hr in sorted(belady.items()):
        rows.append(["belady", str(cap), *[""] * (len(tiers) - 1), f"{100 * hr:.2f}%",
                     *[""] * len(tiers), "", ""])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def format_served_table(results: Sequence[ServedResult], belady: Mapping[int, float]) -> str:
    """One row per policy and configuration of the served topology."""
    tiers = [t for t in SIDECAR_TIERS if any(t in r.tiers for r in results)]
    head = ["policy", "engine blocks", *[f"{t} blocks" for t in tiers], "hold budget",
            "hit rate", "from engine", *[f"from {t}" for t in tiers], "prefill s saved",
            "TTFT p50 s", "TTFT p99 s", "after tool p50 s", "GB moved"]
    rows = [head]
    for r in results:
        rows.append([
            r.policy, str(r.engine_blocks), *[str(r.tiers.get(t, 0)) for t in tiers],
            str(r.hold_budget_blocks), f"{100 * r.hit_rate:.2f}%",
            *[f"{100 * r.hits_by_tier.get(t, 0.0):.2f}%" for t in ("engine", *tiers)],
            f"{r.prefill_s_saved:.0f}", f"{r.ttft_p50_s:.2f}", f"{r.ttft_p99_s:.2f}",
            f"{r.after_tool_ttft_p50_s:.2f}" if r.after_tool_requests else "-",
            f"{sum(r.bytes_moved.values()) / 1e9:.1f}",
        ])
    for cap, hr in sorted(belady.items()):
        row = [""] * len(head)
        row[0], row[1], row[2] = "belady (sidecar alone)", "0", str(cap)
        row[head.index("hit rate")] = f"{100 * hr:.2f}%"
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def plot_hit_rates(results: Sequence[ReplayResult | ServedResult], belady: Mapping[int, float],
                   path: str | Path, title: str = "") -> None:
    """Hit rate against total capacity (blocks), one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append((sum(r.tiers.values()), r.hit_rate))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in sorted(by_policy.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=name)
    if belady:
        pts = sorted(belady.items())
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "k--", marker="x",
                label="belady (offline)")
    ax.set_xscale("log")
    ax.set_xlabel("total capacity (blocks)")
    ax.set_ylabel("prefix hit rate (%)")
    ax.set_title(title or "hit rate vs capacity")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
