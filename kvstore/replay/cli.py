"""``kvstore replay``: replay a trace through policies, or generate one.

Offline, each run is the server's engine with in-memory tiers (see
:mod:`kvstore.replay.driver`); ``--server ADDR`` plays the same requests against
a running ``kvstore serve`` instead (:mod:`kvstore.replay.live`).
``add_parser(subparsers)`` registers the subcommand; the main CLI calls it.
Capacities may be given as comma lists (``--hbm-blocks 1000,2000``): each value
is one run (tiers are zipped; a single value is reused).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Sequence

from kvstore import policies
from kvstore.policies.cost import READ_BYTES_PER_S, CostModel
from kvstore.replay.belady import belady_hit_rate
from kvstore.replay.driver import ReplayResult, TierBudget, replay_offline
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.results import format_table, plot_hit_rates, write_json
from kvstore.replay.trace import Request, TraceError, dump_trace, load_trace

__all__ = ["add_parser", "block_counts", "main", "run"]


def block_counts(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers like 1000,2000, got {text!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return vals


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("replay", help="replay a trace through cache policies",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(p)


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="Mooncake JSONL trace (.gz or not); the output with --generate")
    p.add_argument("--policy", action="append", default=None,
                   help=f"policy name, repeatable (default lru); one of "
                        f"{', '.join(policies.available())}")
    p.add_argument("--hbm-blocks", type=block_counts, default=[1000], metavar="N[,N...]")
    p.add_argument("--dram-blocks", type=block_counts, default=[0], metavar="N[,N...]")
    p.add_argument("--disk-blocks", type=block_counts, default=[0], metavar="N[,N...]")
    p.add_argument("--prefill-tps", type=float, default=CostModel().prefill_tokens_per_s,
                   help="prefill tokens/s of the cost model (default %(default)s)")
    p.add_argument("--belady", action="store_true",
                   help="add the offline optimum for one tier of the total capacity")
    p.add_argument("--belady-bypass", action="store_true",
                   help="also print Belady with bypass (a missed block needed later than "
                        "every cached one is not stored: the bound for admitting policies)")
    p.add_argument("--server", metavar="ADDR",
                   help="play the trace against a running kvstore serve at ADDR (its policy "
                        "and tiers) instead of the engine in this process")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="with --server: trace time runs this many times faster")
    p.add_argument("--payload-bytes", type=int, default=64 << 10,
                   help="with --server: bytes of each block's payload (default 64 KiB)")
    p.add_argument("--no-retention", action="store_true",
                   help="ignore the trace's cache_ttl_s (the same trace without retention)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="replay only the first N requests")
    p.add_argument("--json", metavar="OUT", help="write results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="plot hit rate against capacity")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--generate", choices=KINDS, metavar="KIND",
                   help=f"write a generated trace to TRACE instead ({', '.join(KINDS)})")
    p.add_argument("--sessions", type=int, default=200, help="sessions to generate")
    p.add_argument("--duration-s", type=float, default=3600.0, help="span of session starts")
    p.add_argument("--scale", type=float, default=1.0, help="length scale of generated prompts")
    p.add_argument("--seed", type=int, default=0)
    from kvstore.replay.fleet import add_fleet_arguments

    add_fleet_arguments(p)
    p.set_defaults(func=run)


def _budgets(args: argparse.Namespace) -> list[list[TierBudget]]:
    cols = [("hbm", args.hbm_blocks), ("dram", args.dram_blocks), ("disk", args.disk_blocks)]
    n = max(len(v) for _, v in cols)
    for name, v in cols:
        if len(v) not in (1, n):
            raise ValueError(f"--{name}-blocks has {len(v)} values; give 1 or {n}")
    runs = []
    for i in range(n):
        budget = [TierBudget(name, v[i if len(v) > 1 else 0]) for name, v in cols]
        budget = [b for b in budget if b.blocks > 0]
        if not budget:
            raise ValueError("every tier has 0 blocks; give --hbm-blocks N")
        runs.append(budget)
    return runs


def replay(requests: Sequence[Request], names: Sequence[str], runs: list[list[TierBudget]],
           cost: CostModel, progress: bool) -> list[ReplayResult]:
    """Each policy over each tier budget, through the engine (one run each)."""
    from tqdm import tqdm

    results = []
    for budget in runs:
        for name in names:
            label = f"{name} " + "/".join(f"{b.name}={b.blocks}" for b in budget)
            with tqdm(total=len(requests), desc=label, unit="req", disable=not progress,
                      leave=False) as bar:
                results.append(asyncio.run(replay_offline(requests, name, budget, cost,
                                                          bar.update)))
    return results


def run(args: argparse.Namespace) -> int:
    if args.generate:
        cfg = GenConfig(args.sessions, args.duration_s, args.seed, args.scale)
        try:
            n = dump_trace(generate(args.generate, cfg), args.trace)
        except ValueError as exc:
            print(f"kvstore replay: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {n} requests ({args.generate}) to {args.trace}")
        return 0
    if args.workers:
        from kvstore.replay.fleet import run_fleet

        return run_fleet(args)
    names = args.policy or ["lru"]
    try:
        for name in names:
            if name not in policies.available():
                raise ValueError(f"unknown policy {name!r}; valid: "
                                 f"{', '.join(policies.available())}")
        runs = _budgets(args)
        cost = CostModel(prefill_tokens_per_s=args.prefill_tps)
        requests = load_trace(args.trace)
    except (OSError, TraceError, ValueError) as exc:
        print(f"kvstore replay: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        requests = requests[:args.limit]
    if args.no_retention:
        requests = [dataclasses.replace(r, cache_ttl_s=None) for r in requests]
    progress = not args.no_progress and sys.stderr.isatty()
    if args.server:
        return _run_live(args, requests, cost, progress)
    results = replay(requests, names, runs, cost, progress)
    belady = {}
    if args.belady:
        for budget in runs:
            total = sum(b.blocks for b in budget)
            if total not in belady:
                belady[total] = belady_hit_rate(requests, total)
    print(format_table(results, belady))
    if args.belady_bypass:
        for total in sorted({sum(b.blocks for b in budget) for budget in runs}):
            hr = belady_hit_rate(requests, total, bypass=True)
            print(f"belady with bypass, {total} blocks: {100 * hr:.2f}%")
    meta = {"trace": str(args.trace), "requests": len(requests),
            "lookups": sum(len(r.hash_ids) for r in requests),
            "cost_model": {"prefill_tokens_per_s": cost.prefill_tokens_per_s,
                           "block_tokens": cost.block_tokens, "block_bytes": cost.block_bytes,
                           "read_bytes_per_s": READ_BYTES_PER_S}}
    if args.json:
        write_json(results, belady, args.json, meta)
    if args.plot:
        plot_hit_rates(results, belady, args.plot, str(args.trace))
    return 0


def _run_live(args: argparse.Namespace, requests: Sequence[Request], cost: CostModel,
              progress: bool) -> int:
    from tqdm import tqdm

    from kvstore.errors import KVStoreError
    from kvstore.replay.live import replay_live

    try:
        with tqdm(total=len(requests), desc=f"live {args.server}", unit="req",
                  disable=not progress, leave=False) as bar:
            result = asyncio.run(replay_live(requests, args.server, cost, args.payload_bytes,
                                             args.speedup, bar.update))
    except (KVStoreError, ValueError) as exc:
        print(f"kvstore replay: {exc}", file=sys.stderr)
        return 2
    print(format_table([result], {}))
    if args.json:
        write_json([result], {}, args.json, {"trace": str(args.trace), "server": args.server,
                                             "speedup": args.speedup,
                                             "payload_bytes": args.payload_bytes})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code
