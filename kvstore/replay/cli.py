"""``kvstore replay``: replay a trace through policies, or generate one.

Offline, each run is the served topology (:mod:`kvstore.replay.served`): the
engine's own prefix cache of ``--engine-blocks`` (vLLM's, not the policy's) in
front of the sidecar's tiers (``--dram-blocks`` / ``--disk-blocks`` /
``--redis-blocks``) under the policy, run by the server's engine with in-memory
tiers. ``--engine-blocks 0 --dram-blocks N`` is the sidecar's DRAM alone.
``--server ADDR`` plays the same requests against a running ``kvstore serve``
instead (:mod:`kvstore.replay.live`). ``add_parser(subparsers)`` registers the
subcommand; the main CLI calls it. Capacities may be given as comma lists
(``--dram-blocks 1000,2000``): each value is one run (tiers are zipped; a single
value is reused). ``--workers N`` replays over N such workers behind a router
(:mod:`kvstore.replay.fleet`; one value per capacity). ``--hbm-blocks`` is gone, from
the fleet replay too (a GPU tier the policy manages exists in no deployment).
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
from kvstore.replay.driver import TierBudget
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.results import format_served_table, format_table, plot_hit_rates, write_json
from kvstore.replay.served import (
    DEFAULT_HOLD_MAX_S,
    DEFAULT_MAX_RUNNING,
    DEFAULT_TPOT_S,
    EngineModel,
    ServedConfig,
    ServedResult,
    replay_served,
    sidecar_alone,
)
from kvstore.replay.trace import Request, TraceError, dump_trace, load_trace

__all__ = ["add_parser", "block_counts", "main", "run"]

#: What ``--hbm-blocks`` says (the single and the fleet replay alike).
HBM_GONE = ("--hbm-blocks is gone from the replay: the GPU is the engine's own prefix cache, "
            "give its size with --engine-blocks N (vLLM's cache: every computed block enters "
            "it, freed blocks are evicted LRU, the policy only asks for holds); a "
            "policy-managed tier of that size is the sidecar's --dram-blocks N")


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
    p.add_argument("--engine-blocks", type=block_counts, default=[0], metavar="N[,N...]",
                   help="the engine's own prefix cache (vLLM's GPU blocks less its null "
                        "block), default 0")
    p.add_argument("--hbm-blocks", type=block_counts, default=None, metavar="N",
                   help="gone: see --engine-blocks")
    p.add_argument("--dram-blocks", type=block_counts, default=None, metavar="N[,N...]",
                   help="the sidecar's DRAM tier (default 1000)")
    p.add_argument("--disk-blocks", type=block_counts, default=[0], metavar="N[,N...]")
    p.add_argument("--redis-blocks", type=block_counts, default=[0], metavar="N[,N...]")
    p.add_argument("--hold-budget-blocks", type=block_counts, default=None, metavar="N[,N...]",
                   help="most engine blocks the connector's keeps hold at once (default a "
                        "quarter of --engine-blocks, as the connector's; 0: no holds)")
    p.add_argument("--hold-max-s", type=float, default=DEFAULT_HOLD_MAX_S,
                   help="longest keep (the connector's hold_max_ms; default %(default)s s)")
    p.add_argument("--max-running", type=int, default=DEFAULT_MAX_RUNNING,
                   help="requests the engine runs at once (default %(default)s)")
    p.add_argument("--tpot-ms", type=float, default=1e3 * DEFAULT_TPOT_S,
                   help="decode time per output token (default %(default)s ms)")
    p.add_argument("--no-decode-saves", action="store_true",
                   help="do not save the blocks the output tokens fill")
    p.add_argument("--trust-end", action="store_true",
                   help="send the trace's end as session_end (default: turn_end, since no "
                        "client knows a session's last request)")
    p.add_argument("--no-then", action="store_true",
                   help="lookups carry no then / tool (the hint still comes at the end)")
    p.add_argument("--instant", action="store_true",
                   help="requests take no time and transfers are instant (with "
                        "--engine-blocks 0 --no-decode-saves --trust-end --no-then: exactly "
                        "the single-tier replay that the tables before the served "
                        "topology used, on a trace whose blocks are all full; that one "
                        "also stored a partial last block, as no engine does)")
    p.add_argument("--no-after", action="store_true",
                   help="drop every after from the trace (the ablation without hints: "
                        "no turn is described, so nothing is sent, as the connector does)")
    p.add_argument("--prefill-tps", type=float, default=CostModel().prefill_tokens_per_s,
                   help="prefill tokens/s of the cost model and the engine model "
                        "(default %(default)s)")
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


def _runs(args: argparse.Namespace) -> list[ServedConfig]:
    """One served configuration per zipped value of the capacity lists."""
    if args.hbm_blocks is not None and any(args.hbm_blocks):
        raise ValueError(HBM_GONE)  # (0, as old commands for DRAM alone said, is no tier)
    dram = args.dram_blocks if args.dram_blocks is not None else [1000]
    cols = [("engine", args.engine_blocks), ("dram", dram), ("disk", args.disk_blocks),
            ("redis", args.redis_blocks)]
    if args.hold_budget_blocks is not None:
        cols.append(("hold-budget", args.hold_budget_blocks))
    n = max(len(v) for _, v in cols)
    for name, v in cols:
        if len(v) not in (1, n):
            raise ValueError(f"--{name}-blocks has {len(v)} values; give 1 or {n}")
    if args.max_running < 1:
        raise ValueError(f"--max-running must be >= 1, got {args.max_running}")
    if args.tpot_ms < 0 or args.hold_max_s < 0:
        raise ValueError("--tpot-ms and --hold-max-s must be >= 0")
    model = (EngineModel.instant() if args.instant
             else EngineModel(args.prefill_tps, args.tpot_ms / 1e3, args.max_running))
    runs = []
    for i in range(n):
        at = {name: v[i if len(v) > 1 else 0] for name, v in cols}
        sidecar = tuple(TierBudget(t, at[t]) for t in ("dram", "disk", "redis") if at[t] > 0)
        if not sidecar:
            raise ValueError("the sidecar has no tier: give --dram-blocks N (and/or "
                             "--disk-blocks / --redis-blocks)")
        hold = at.get("hold-budget", at["engine"] // 4)
        runs.append(ServedConfig(at["engine"], sidecar, hold, args.hold_max_s, model,
                                 decode_saves=not args.no_decode_saves,
                                 trust_end=args.trust_end, send_then=not args.no_then))
    return runs


def replay(requests: Sequence[Request], names: Sequence[str], capacities: Sequence[int],
           cost: CostModel, progress: bool) -> list[ServedResult]:
    """Each policy at each capacity of the sidecar's DRAM alone (:func:`sidecar_alone`:
    no engine cache, untimed; one run each, capacity outer). The capacity curves of
    ``kvstore profile`` use it."""
    runs = [sidecar_alone([TierBudget("dram", c)]) for c in capacities]
    return replay_served_runs(requests, names, runs, cost, progress)


def replay_served_runs(requests: Sequence[Request], names: Sequence[str],
                       runs: Sequence[ServedConfig], cost: CostModel, progress: bool
                       ) -> list[ServedResult]:
    """Each policy over each configuration, in the served topology (one run each)."""
    from tqdm import tqdm

    results = []
    for cfg in runs:
        for name in names:
            label = (f"{name} engine={cfg.engine_blocks} "
                     + "/".join(f"{b.name}={b.blocks}" for b in cfg.sidecar))
            with tqdm(total=len(requests), desc=label, unit="req", disable=not progress,
                      leave=False) as bar:
                results.append(asyncio.run(replay_served(requests, name, cfg, cost,
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
    names = args.policy or ["lru"]
    fleet = args.workers is not None
    try:
        for name in names:
            if name not in policies.available():
                raise ValueError(f"unknown policy {name!r}; valid: "
                                 f"{', '.join(policies.available())}")
        runs = _runs(args) if not args.server or fleet else []
        if fleet:
            from kvstore.replay.fleet import check_fleet

            worker = check_fleet(args, runs)
        cost = CostModel(prefill_tokens_per_s=args.prefill_tps)
        requests = load_trace(args.trace)
    except (OSError, TraceError, ValueError) as exc:
        print(f"kvstore replay: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        requests = requests[:args.limit]
    if args.no_retention:
        requests = [dataclasses.replace(r, cache_ttl_s=None) for r in requests]
    if args.no_after:
        requests = [dataclasses.replace(r, after=None) for r in requests]
    progress = not args.no_progress and sys.stderr.isatty()
    if fleet:
        from kvstore.replay.fleet import run_fleet

        return run_fleet(args, names, worker, requests, cost, progress)
    if args.server:
        return _run_live(args, requests, cost, progress)
    results = replay_served_runs(requests, names, runs, cost, progress)
    belady = {}
    if args.belady:  # over the sidecar's capacity: the bound of its DRAM alone
        for run_cfg in runs:
            total = sum(b.blocks for b in run_cfg.sidecar)
            if total not in belady:
                belady[total] = belady_hit_rate(requests, total)
    print(format_served_table(results, belady))
    if args.belady_bypass:
        for total in sorted({sum(b.blocks for b in c.sidecar) for c in runs}):
            hr = belady_hit_rate(requests, total, bypass=True)
            print(f"belady with bypass, {total} blocks: {100 * hr:.2f}%")
    meta = {"trace": str(args.trace), "requests": len(requests),
            "lookups": sum(len(r.hash_ids) for r in requests),
            "engine_model": {"prefill_tokens_per_s": args.prefill_tps,
                             "time_per_output_token_s": args.tpot_ms / 1e3,
                             "max_running": args.max_running, "hold_max_s": args.hold_max_s,
                             "decode_saves": not args.no_decode_saves,
                             "trust_end": args.trust_end, "no_after": args.no_after,
                             "no_then": args.no_then, "instant": args.instant},
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
