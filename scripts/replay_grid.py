"""The "sidecar DRAM alone" grid: every policy, every trace, three capacities.

The sidecar's DRAM tier of N blocks behind no engine cache, untimed
(``kvstore replay --engine-blocks 0 --dram-blocks N --instant --no-decode-saves
--trust-end --no-then``: ``kvstore.replay.served.sidecar_alone``), through the served
replay and so the server's engine, for
the agent and conversation traces (``../shared/traces``) and every generated kind over
several seeds. Prints one table per trace: hit rate per policy and capacity, Belady
with bypass, and the points each policy is above LRU (``never below LRU`` is checked
with a 0.2-point tolerance and failures are listed at the end).

  .venv/bin/python scripts/replay_grid.py                       # everything
  .venv/bin/python scripts/replay_grid.py --only generated --seeds 5
  .venv/bin/python scripts/replay_grid.py --only agent --agent-limit 8000
  .venv/bin/python scripts/replay_grid.py --only ablation      # hints vs no ``after``
  .venv/bin/python scripts/replay_grid.py --only generated --sessionless  # no session named
  .venv/bin/python scripts/replay_grid.py --only generated --engine-share 0.05 \
      --shares 0.1,0.3,0.6 --first-seed 11   # served topology, seeds no figure was tuned on

Generated traces are small (``--sessions``, ``--scale``) and their capacities are
shares of the trace's distinct blocks (``--shares``), so every kind is tight, middling
and loose whatever its size. ``--sessionless`` removes every generated request's
``session_id``, ``workload`` and ``after`` (as a Mooncake-style trace: the engine infers
the sessions); those are checked never below LRU as well. ``--engine-share`` plays the
generated traces in the served topology instead (vLLM's prefix cache of that share of the
distinct blocks in front of the DRAM, a hold budget of a quarter of it, requests timed by
the default engine model: ``kvstore replay --engine-blocks E --dram-blocks N``); there is
no offline bound for it, so those tables have no Belady row. ``--jobs`` runs replays in
parallel processes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kvstore.policies.cost import CostModel

from kvstore.replay.belady import belady_hit_rate
from kvstore.replay.driver import TierBudget
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.served import replay_served, sidecar_alone
from kvstore.replay.served_config import ServedConfig
from kvstore.replay.trace import Request, load_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
AGENT = TRACES / "weka" / "claude_code_agent_trace.jsonl.gz"
CONVERSATION = TRACES / "conversation_trace.jsonl.gz"
POLICIES = ("lru", "vllm-lru", "vllm-arc", "ttl", "workload", "adaptive")
TOLERANCE = 0.002


#: ``--adaptive-option`` values: the adaptive policy's constructor options (ablations)
ADAPTIVE_OPTIONS: dict[str, float] = {}


def _one(args: tuple[Sequence[Request], str, int, int, dict[str, float]]) -> float:
    reqs, policy, blocks, engine, adaptive = args
    cfg = (ServedConfig(engine, (TierBudget("dram", blocks),), engine // 4) if engine
           else sidecar_alone([TierBudget("dram", blocks)]))
    options = adaptive if policy == "adaptive" and adaptive else None
    res = asyncio.run(replay_served(reqs, policy, cfg, CostModel(), options=options))
    return res.hit_rate


def _bound(args: tuple[Sequence[Request], int]) -> float:
    return belady_hit_rate(args[0], args[1], bypass=True)


def grid(pool: ProcessPoolExecutor, reqs: Sequence[Request], caps: Sequence[int],
         names: Sequence[str], engine: int = 0) -> dict[str, list[float]]:
    """Hit rate per policy (and ``belady-bypass``, for the sidecar alone) per DRAM
    capacity, behind an engine cache of ``engine`` blocks (0: none)."""
    jobs = {(p, c): pool.submit(_one, (reqs, p, c, engine, ADAPTIVE_OPTIONS))
            for p in names for c in caps}
    bounds = {} if engine else {c: pool.submit(_bound, (reqs, c)) for c in caps}
    out = {p: [jobs[p, c].result() for c in caps] for p in names}
    if bounds:
        out["belady-bypass"] = [bounds[c].result() for c in caps]
    return out


def table(title: str, caps: Sequence[int], rows: dict[str, list[float]]) -> str:
    lru = rows["lru"]
    bound = rows.get("belady-bypass", lru)  # none behind an engine cache: no gap share
    lines = [f"### {title}", "", "| policy | " + " | ".join(f"{c:,}" for c in caps) + " |",
             "|---|" + "---|" * len(caps)]
    for p, vals in rows.items():
        cells = []
        for v, b, u in zip(vals, lru, bound, strict=True):
            cell = f"{100 * v:.2f}%"
            if p not in ("lru", "belady-bypass"):
                gap = u - b
                share = f", {100 * (v - b) / gap:.0f}% of gap" if gap > 0.005 else ""
                cell += f" ({100 * (v - b):+.2f}{share})"
            cells.append(cell)
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def below_lru(title: str, caps: Sequence[int], rows: dict[str, list[float]],
              policy: str) -> list[str]:
    return [f"{title} at {c}: {policy} {100 * v:.2f}% < lru {100 * b:.2f}%"
            for c, v, b in zip(caps, rows[policy], rows["lru"], strict=True)
            if v < b - TOLERANCE]


def no_after(reqs: Sequence[Request]) -> list[Request]:
    """The same trace with every ``after`` (the turn's end hint) removed."""
    return [dataclasses.replace(r, after=None) for r in reqs]


def sessionless(reqs: Sequence[Request]) -> list[Request]:
    """The same trace with no session named: every ``session_id``, ``workload`` and
    ``after`` removed (the engine infers the sessions from the prefixes)."""
    return [dataclasses.replace(r, session_id=None, workload=None, after=None) for r in reqs]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("agent", "conversation", "generated", "ablation"),
                   action="append")
    p.add_argument("--policy", action="append", help=f"default: {', '.join(POLICIES)}")
    p.add_argument("--agent-limit", type=int, default=None,
                   help="replay only the agent trace's first N requests")
    p.add_argument("--agent-caps", default="500,1000,2000")
    p.add_argument("--ablation-caps", default="500,1000,2000")
    p.add_argument("--conversation-caps", default="1000,2000,5000")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--sessions", type=int, default=120)
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--shares", default="0.05,0.15,0.4",
                   help="generated capacities as shares of the trace's distinct blocks")
    p.add_argument("--first-seed", type=int, default=0,
                   help="generated seeds first-seed .. first-seed + seeds - 1 (seeds no "
                        "figure was tuned on: 11 and up)")
    p.add_argument("--engine-share", type=float, default=0.0,
                   help="generated traces in the served topology: vLLM's cache of this "
                        "share of the distinct blocks in front of the DRAM (hold budget a "
                        "quarter of it, requests timed); 0 (default): the sidecar alone")
    p.add_argument("--adaptive-option", action="append", default=[], metavar="NAME=VALUE",
                   help="an option of the adaptive policy (an ablation, e.g. "
                        "credit_per_allowance=inf: the trial credit before it was bounded)")
    p.add_argument("--sessionless", action="store_true",
                   help="generated traces with no session named (session_id, workload "
                        "and after removed)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    for opt in args.adaptive_option:
        name, sep, value = opt.partition("=")
        if not sep:
            p.error(f"--adaptive-option takes NAME=VALUE, got {opt!r}")
        try:
            ADAPTIVE_OPTIONS[name] = float(value)
        except ValueError:
            p.error(f"--adaptive-option {name}: {value!r} is not a number")
    parts = args.only or ["agent", "conversation", "generated"]
    names = args.policy or list(POLICIES)
    if "lru" not in names:  # (every table and the never-below-LRU check compare with it)
        names.insert(0, "lru")
    failures: list[str] = []
    start = time.perf_counter()
    print(f"load average {os.getloadavg()[0]:.1f}, jobs {args.jobs}", flush=True)
    with ProcessPoolExecutor(args.jobs) as pool:
        if "agent" in parts or "ablation" in parts:
            reqs = load_trace(AGENT)
            if args.agent_limit:
                reqs = reqs[:args.agent_limit]
            caps = [int(c) for c in args.agent_caps.split(",")]
            label = f"agent trace ({len(reqs):,} requests)"
            if "agent" in parts:
                rows = grid(pool, reqs, caps, names)
                print(table(label, caps, rows), "\n", flush=True)
                for n in names:
                    if n in ("workload", "adaptive"):
                        failures += below_lru(label, caps, rows, n)
            if "ablation" in parts:
                caps = [int(c) for c in args.ablation_caps.split(",")]
                abl = grid(pool, no_after(reqs), caps, ["lru", "ttl", "workload", "adaptive"])
                print(table(label + ", every `after` removed", caps, abl), "\n", flush=True)
        if "conversation" in parts:
            reqs = load_trace(CONVERSATION)
            caps = [int(c) for c in args.conversation_caps.split(",")]
            label = f"conversation trace ({len(reqs):,} requests)"
            rows = grid(pool, reqs, caps, names)
            print(table(label, caps, rows), "\n", flush=True)
            for n in names:
                if n in ("workload", "adaptive"):
                    failures += below_lru(label, caps, rows, n)
        if "generated" in parts:
            shares = [float(s) for s in args.shares.split(",")]
            for kind in args.kinds.split(","):
                label = f"{kind} (no session named)" if args.sessionless else kind
                if args.engine_share:
                    label += f", behind an engine cache of {args.engine_share:g}"
                per_seed: list[dict[str, list[float]]] = []
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    reqs = generate(kind, GenConfig(args.sessions, args.duration_s, seed,
                                                    args.scale))
                    if args.sessionless:
                        reqs = sessionless(reqs)
                    distinct = len({h for r in reqs for h in r.hash_ids})
                    caps = [max(4, round(s * distinct)) for s in shares]
                    engine = round(args.engine_share * distinct)
                    rows = grid(pool, reqs, caps, names, engine)
                    per_seed.append(rows)
                    for n in names:
                        if n in ("workload", "adaptive"):
                            failures += below_lru(f"{label} seed {seed}", caps, rows, n)
                mean = {k: [statistics.fmean(r[k][i] for r in per_seed)
                            for i in range(len(shares))] for k in per_seed[0]}
                worst = {k: min(100 * (r[k][i] - r["lru"][i]) for r in per_seed
                                for i in range(len(shares))) for k in names}
                title = (f"{label}: mean of {args.seeds} seeds, capacities "
                         + "/".join(f"{s:g}" for s in shares) + " of distinct blocks")
                print(table(title, [round(100 * s) for s in shares], mean))
                print("worst point vs lru over seeds and capacities: "
                      + ", ".join(f"{k} {v:+.2f}" for k, v in worst.items()), "\n", flush=True)
    print(f"{time.perf_counter() - start:.0f} s; load average {os.getloadavg()[0]:.1f}")
    print("below lru (0.2-point tolerance): " + ("none" if not failures else ""))
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
