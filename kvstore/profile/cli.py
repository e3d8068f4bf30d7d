"""``kvstore profile``: the numbers that describe a workload, from a trace or a
running server.

``kvstore profile TRACE`` reads Mooncake JSONL (with or without sessions) or an
Azure LLM inference CSV and prints input / output lengths and their ratio,
context length, the (input, output) quadrant mix, the arrival pattern
(requests per minute, peak-to-trough ratio, burstiness), prefix reuse of an
unbounded cache, session gaps after tool calls and user turns, the hit rate
against capacity from the replay (LRU and workload, Belady as the bound) and
sizing advice with a ``kvstore.toml`` fragment. ``kvstore profile --server
ADDR`` prints the live profile a running sidecar keeps over its recent traffic.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kvstore.profile.curves import DEFAULT_POINTS, DEFAULT_POLICIES
from kvstore.profile.sizing import DEFAULT_MODEL, MODELS

__all__ = ["add_parser", "main", "run"]

T = TypeVar("T")

#: Traces with at least this many requests get progress bars (on a terminal).
LONG_TRACE = 5000


def _capacities(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(
            f"expected block counts >= 1 like 1000,5000, got {text!r}")
    return vals


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="?", help="Mooncake JSONL or Azure CSV trace (.gz or not)")
    p.add_argument("--server", metavar="ADDR", help="print a running server's live profile")
    p.add_argument("--json", metavar="FILE", help="write the profile as JSON")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--policy", action="append", default=None,
                   help=f"policy for the capacity curve, repeatable (default: "
                        f"{', '.join(DEFAULT_POLICIES)})")
    p.add_argument("--points", type=_positive, default=DEFAULT_POINTS,
                   help="capacities on the curve, doubling up to the trace's distinct blocks "
                        "(default %(default)s)")
    p.add_argument("--capacities", type=_capacities, metavar="N[,N...]",
                   help="explicit capacities in blocks instead of --points")
    p.add_argument("--no-curve", action="store_true",
                   help="skip the replay (no capacity curve, no sizing)")
    p.add_argument("--model", default=DEFAULT_MODEL, type=str.lower,
                   help=f"model for KV bytes per token: {', '.join(MODELS)} "
                        "(default %(default)s)")
    p.add_argument("--kv-bytes-per-token", type=_positive, metavar="N",
                   help="KV bytes per token (overrides --model)")
    p.add_argument("--bin-s", type=float, metavar="S",
                   help="bin width for peak / trough (default: 3600 when the trace spans >= 3 "
                        "hours, else 60)")
    p.add_argument("--timeout", type=float, default=10.0, help="--server: RPC timeout")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("profile", help="profile a workload (trace or running server)",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(p)


class _Bars:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, items: Iterable[T], total: int | None, desc: str) -> Iterable[T]:
        if not self.enabled:
            return items
        from tqdm import tqdm

        bar: Iterable[T] = tqdm(items, total=total, desc=desc, unit="req", leave=False,
                                mininterval=0.5)
        return bar


def _live(args: argparse.Namespace) -> int:
    from kvstore.client import KVStoreClient
    from kvstore.profile.text import format_profile

    with KVStoreClient(args.server, timeout=args.timeout, shared_memory=False) as c:
        prof = c.profile()
    print(format_profile(prof))
    if args.json:
        _write_json(prof.to_json(), args.json)
    return 0


def _write_json(doc: dict[str, Any], path: str) -> None:
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    from kvstore import policies
    from kvstore.profile.load import load
    from kvstore.profile.report import profile_trace
    from kvstore.profile.sizing import model_kv
    from kvstore.profile.text import format_profile
    from kvstore.replay.trace import TraceError

    if args.server:
        if args.trace:
            print("kvstore profile: give a TRACE or --server, not both", file=sys.stderr)
            return 2
        return _live(args)
    if not args.trace:
        print("kvstore profile: give a TRACE (or --server ADDR)", file=sys.stderr)
        return 2
    names = args.policy or list(DEFAULT_POLICIES)
    tty = sys.stderr.isatty() and not args.no_progress
    try:
        for name in names:
            if name not in policies.available():
                raise ValueError(f"unknown policy {name!r}; valid: "
                                 f"{', '.join(policies.available())}")
        if args.kv_bytes_per_token is None:
            model_kv(args.model)
        if args.bin_s is not None and args.bin_s <= 0:
            raise ValueError(f"--bin-s must be > 0, got {args.bin_s}")
        trace = load(args.trace, _Bars(tty))
    except (OSError, TraceError, ValueError) as exc:
        print(f"kvstore profile: {exc}", file=sys.stderr)
        return 2
    bars = _Bars(tty and len(trace.requests) >= LONG_TRACE)
    prof, rows = profile_trace(
        trace, curve=not args.no_curve, policies=names, points=args.points,
        capacities=args.capacities, model=args.model, kv_bytes_per_token=args.kv_bytes_per_token,
        bin_s=args.bin_s, progress=bars, replay_progress=bars.enabled)
    print(format_profile(prof))
    if args.json:
        _write_json(prof.to_json(), args.json)
    if args.plot:
        from kvstore.profile.plots import write_plots

        for path in write_plots(prof, rows, args.plot):
            print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore profile", description=__doc__)
    _configure(parser)
    args = parser.parse_args(argv)
    return int(args.func(args))
