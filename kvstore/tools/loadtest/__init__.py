"""``kvstore loadtest``: many concurrent clients, a mixed workload, every byte checked.

Starts a real ``kvstore serve`` with a small DRAM tier in front of disk (so
evictions, demotions, promotions and write-backs run all the time) unless
``--address`` points at a running server, then runs ``--clients`` clients for
``--seconds``: puts through shared memory and gRPC, lookups, gets and get_into
on overlapping chains, and a few deletes. Every block read is compared with the
bytes derived from its hash. Prints operations, wrong blocks, refusals,
unexpected errors, p50/p99 latency per operation, the server's resident memory
over the run, and its failure counters.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvstore.tools.loadtest.run import FAILURE_COUNTERS, own_server, run
from kvstore.tools.loadtest.workload import OPS, LoadSpec, parse_mix

__all__ = ["LoadSpec", "add_parser", "passed", "print_result", "run"]


def passed(result: dict[str, Any]) -> bool:
    """No wrong bytes anywhere, no unexpected error, no corrupt read on the server."""
    return (result["wrong_blocks"] == 0 and result["unexpected_errors"] == 0
            and result["final_check"]["wrong"] == 0
            and not result["server_stats"].get("corrupt_reads"))


def print_result(r: dict[str, Any]) -> None:
    """The human-readable report of a :func:`run` result."""
    spec = r["spec"]
    print(f"{spec['clients']} clients ({spec['processes']} process(es)), {spec['seconds']:g} s "
          f"against {r['address']}: {r['total_ops']:,d} operations, "
          f"{r['verified_blocks']:,d} blocks read and checked")
    print(f"{'operation':>9} {'count':>8} {'/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'checked':>9} {'wrong':>6} {'missed':>7} {'refused':>8}")
    for op, o in r["ops"].items():
        p50 = f"{o['p50_ms']:.2f}" if o["p50_ms"] is not None else "-"
        p99 = f"{o['p99_ms']:.2f}" if o["p99_ms"] is not None else "-"
        print(f"{op:>9} {o['count']:>8,d} {o['per_s']:>7.1f} {p50:>8} {p99:>8} "
              f"{o['verified_blocks']:>9,d} {o['wrong_blocks']:>6,d} {o['missed_blocks']:>7,d} "
              f"{o['refused']:>8,d}")
    fc = r["final_check"]
    print(f"wrong blocks: {r['wrong_blocks']} during the run, {fc['wrong']} in the final "
          f"re-read ({fc['verified']:,d} intact, {fc['missing']:,d} not stored)")
    print(f"refused (RESOURCE_EXHAUSTED, expected under saturation): {r['refused']:,d}; "
          f"unexpected errors: {r['unexpected_errors']} {r['unexpected'] or ''}")
    for line in r["samples"]:
        print(f"  {line}")
    mem = r["memory"]
    if mem and "start_mib" in mem:
        print(f"server RSS: {mem['start_mib']} MiB at start, {mem['end_mib']} at end, peak "
              f"{mem['peak_mib']}; second half trend {mem['second_half_slope_mib_per_min']:+} "
              f"MiB/min ({mem['second_half_growth_mib']:+} MiB over it)")
    st = r["server_stats"]
    print("server failure counters: " + ", ".join(f"{k} {st.get(k)}" for k in FAILURE_COUNTERS))
    print("PASS" if passed(r) else "FAIL")


def _sizes(text: str) -> tuple[int, ...]:
    from kvstore.config import parse_size

    return tuple(parse_size(s.strip(), "--block-sizes") for s in text.split(",") if s.strip())


def _main(args: argparse.Namespace) -> int:
    spec = LoadSpec(
        clients=args.clients, seconds=args.seconds, block_sizes=_sizes(args.block_sizes),
        chains=args.chains, families=args.families, prefix_blocks=args.prefix_blocks,
        chain_blocks=args.chain_blocks, processes=args.processes, seed=args.seed,
        mix=parse_mix(args.mix) if args.mix else dict(OPS))
    spec.validate()
    if args.address:
        result = run(spec, args.address, args.server_pid)
    else:
        with own_server(args.dram, args.disk) as (address, pid, _log):
            result = run(spec, address, pid)
    print_result(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if passed(result) else 1


def add_parser(sub: Any) -> None:
    d = LoadSpec()
    p = sub.add_parser("loadtest", help="concurrent mixed load; every byte read is checked")
    p.add_argument("--address", help="load a running server instead of starting one")
    p.add_argument("--server-pid", type=int,
                   help="with --address: the server's pid, to sample its memory")
    p.add_argument("--clients", type=int, default=d.clients)
    p.add_argument("--processes", type=int, default=d.processes,
                   help="client processes the clients are spread over (threads in each)")
    p.add_argument("--seconds", type=float, default=d.seconds)
    p.add_argument("--block-sizes", default="16KiB,64KiB,256KiB",
                   help="payload sizes, picked per block by its hash")
    p.add_argument("--dram", default="64MiB", help="DRAM tier of the server it starts")
    p.add_argument("--disk", default="1GiB", help="disk tier of the server it starts")
    p.add_argument("--chains", type=int, default=d.chains)
    p.add_argument("--families", type=int, default=d.families,
                   help="shared prefixes the chains continue")
    p.add_argument("--prefix-blocks", type=int, default=d.prefix_blocks)
    p.add_argument("--chain-blocks", type=int, default=d.chain_blocks)
    p.add_argument("--mix", help="operation weights, e.g. put_shm=2,lookup=3,get_shm=3 "
                   f"(default {','.join(f'{k}={v:g}' for k, v in OPS.items())})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", help="write the result as JSON here")
    p.set_defaults(func=_main)
