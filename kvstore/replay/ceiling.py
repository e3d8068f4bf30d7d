"""How far better learning of the same classes could take ``workload`` (a diagnostic).

``python -m kvstore.replay.ceiling TRACE --hbm-blocks 1000,2000,5000`` replays
the trace through ``workload`` twice per capacity: once as it runs in the
server (learning online from nothing), and once *in-sample*: a fresh policy
that starts with the class statistics and price the first run learned from the
whole trace, and replays it again from an empty cache. The second run sees the
future through its statistics, so it is not a policy result; it bounds what
any better estimator of the same classes' return times could reach. If the
in-sample figure misses a target, the classes (what the engine can see), not
the learning, are what is short.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvstore.policies.cost import CostModel
from kvstore.policies.workload import WorkloadPolicy
from kvstore.replay.cli import block_counts
from kvstore.replay.sim import DEFAULT_BANDWIDTH, ReplayResult, Simulator, TierBudget, tier_specs
from kvstore.replay.trace import Request, TraceError, load_trace

__all__ = ["in_sample", "main"]


def in_sample(requests: Sequence[Request], budget: Sequence[TierBudget],
              cost: CostModel | None = None) -> tuple[ReplayResult, ReplayResult]:
    """(online, in-sample) results of ``workload`` on ``requests``."""
    if not requests:
        raise ValueError("the trace has no requests")
    cost = cost or CostModel()
    specs = tier_specs(budget, cost)
    online = WorkloadPolicy(specs, cost)
    first = Simulator(online, budget, cost, "workload").run(requests)
    start = requests[0].timestamp_ms / 1000.0
    span = requests[-1].timestamp_ms / 1000.0 - start
    fitted = WorkloadPolicy(specs, cost)
    fitted.adopt(online, span, start)
    second = Simulator(fitted, budget, cost, "workload (in-sample)").run(requests)
    return first, second


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvstore.replay.ceiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="Mooncake JSONL trace (.gz or not)")
    p.add_argument("--hbm-blocks", type=block_counts, default=[1000], metavar="N[,N...]")
    args = p.parse_args(argv)
    try:
        requests = load_trace(args.trace)
        rows = []
        for blocks in args.hbm_blocks:
            if blocks < 1:
                raise ValueError(f"--hbm-blocks must be >= 1, got {blocks}")
            budget = [TierBudget("hbm", blocks, DEFAULT_BANDWIDTH["hbm"])]
            online, fitted = in_sample(requests, budget)
            rows.append((blocks, online.hit_rate, fitted.hit_rate))
            print(f"{blocks} blocks: online {100 * online.hit_rate:.2f}%  "
                  f"in-sample {100 * fitted.hit_rate:.2f}%", file=sys.stderr, flush=True)
    except (OSError, TraceError, ValueError) as exc:
        print(f"kvstore ceiling: {exc}", file=sys.stderr)
        return 2
    print("| hbm blocks | workload (online) | workload (in-sample statistics) |")
    print("|---|---|---|")
    for blocks, a, b in rows:
        print(f"| {blocks} | {100 * a:.2f}% | {100 * b:.2f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
