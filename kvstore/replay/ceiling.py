"""What the conversation trace lets ``workload`` reach (diagnostics, not policies).

``python -m kvstore.replay.ceiling TRACE --hbm-blocks 1000,2000,5000`` replays
the trace through ``workload`` as it runs in the server (learning online from
nothing) and, per capacity:

- *in-sample*: a fresh policy that starts with the class statistics and price
  the first run learned from the whole trace, and replays it again from an
  empty cache. It sees the future through its statistics, so it bounds what
  any better estimator of the same classes' return times could reach. If it
  misses a target, the classes (what the engine can see), not the learning,
  are what is short.
- ``--oracle-s S``: online ``workload`` whose classes also carry a perfect
  bit "this block is looked up again within S s". How much that bit is worth
  is how much timing, which only the future knows, is worth.

``--returns`` prints, per request length, how often a request's session comes
back (sessions inferred from prefix chains as the replay does), so a claim like
"short requests come back more often" can be checked against the trace.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
from collections import defaultdict
from collections.abc import Hashable, Sequence

from kvstore.policies.base import BlockInfo, Move, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.workload import Cls, WorkloadPolicy
from kvstore.replay.cli import block_counts
from kvstore.replay.sessions import SessionInferer
from kvstore.replay.sim import DEFAULT_BANDWIDTH, ReplayResult, Simulator, TierBudget, tier_specs
from kvstore.replay.trace import Request, TraceError, load_trace

__all__ = ["LENGTH_BUCKETS", "OracleWorkload", "ReturnRow", "in_sample", "main", "oracle",
           "returns_by_length"]

#: Request-length buckets (blocks, upper bounds exclusive) of the ``--returns`` table.
LENGTH_BUCKETS = (3, 8, 32)


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


class OracleWorkload(WorkloadPolicy):
    """``workload`` whose class also knows whether the block is looked up again
    within ``horizon_s`` (from the trace's future: a diagnostic, never a policy).
    The bit rides in the class's workload field, so the coarse parent a sparse
    class borrows from keeps it too."""

    def __init__(self, tiers: Sequence[TierSpec], cost: CostModel,
                 uses: dict[Hashable, list[float]], horizon_s: float) -> None:
        super().__init__(tiers, cost)
        self._uses = uses
        self._horizon = horizon_s
        self._now = 0.0

    def on_lookup(self, keys: Sequence[Hashable], hit_tiers: Sequence[str | None],
                  info: BlockInfo, now: float) -> list[Move]:
        self._now = now
        return super().on_lookup(keys, hit_tiers, info, now)

    def admit(self, info: BlockInfo, now: float) -> str | None:
        self._now = now
        return super().admit(info, now)

    def _cls(self, info: BlockInfo, uses: int, pos: int, gap: float | None) -> Cls:
        cls = super()._cls(info, uses, pos, gap)
        times = self._uses.get(info.key, [])
        i = bisect.bisect_right(times, self._now)
        soon = i < len(times) and times[i] - self._now <= self._horizon
        return (f"{cls[0]}|{'soon' if soon else 'late'}", *cls[1:])


def oracle(requests: Sequence[Request], budget: Sequence[TierBudget], horizon_s: float,
           cost: CostModel | None = None) -> ReplayResult:
    """``workload`` with a perfect "looked up again within ``horizon_s``" bit."""
    if horizon_s <= 0:
        raise ValueError(f"--oracle-s must be > 0, got {horizon_s}")
    cost = cost or CostModel()
    uses: dict[Hashable, list[float]] = defaultdict(list)
    for req in requests:
        now = req.timestamp_ms / 1000.0
        for k in req.hash_ids:
            uses[k].append(now)
    policy = OracleWorkload(tier_specs(budget, cost), cost, uses, horizon_s)
    return Simulator(policy, budget, cost, f"workload (oracle {horizon_s:g} s)").run(requests)


class ReturnRow:
    """How often requests of one length bucket see their session come back."""

    __slots__ = ("gaps", "label", "requests")

    def __init__(self, label: str) -> None:
        self.label = label
        self.requests = 0
        self.gaps: list[float] = []

    @property
    def back(self) -> float:
        return len(self.gaps) / self.requests if self.requests else 0.0

    def back_within(self, seconds: float) -> float:
        return sum(g <= seconds for g in self.gaps) / self.requests if self.requests else 0.0

    @property
    def median_gap(self) -> float | None:
        return statistics.median(self.gaps) if self.gaps else None


def returns_by_length(requests: Sequence[Request],
                      buckets: Sequence[int] = LENGTH_BUCKETS) -> list[ReturnRow]:
    """Per request-length bucket (and all together, last): share of requests whose
    session sends another request, and the gaps to it. Sessions are the trace's
    ``session_id`` or, without one, inferred from prefix chains as the replay does."""
    edges = list(buckets)
    labels = [f"< {edges[0]}"]
    labels += [f"{a}-{b - 1}" for a, b in zip(edges, edges[1:], strict=False)]
    labels.append(f">= {edges[-1]}")
    rows = [ReturnRow(label) for label in labels] + [ReturnRow("all")]
    infer = SessionInferer()
    pending: dict[str, tuple[int, float]] = {}  # session -> (bucket of its last request, time)
    for req in requests:
        now = req.timestamp_ms / 1000.0
        session = req.session_id or infer.session_for(req.hash_ids)
        last = pending.get(session)
        if last is not None:
            rows[last[0]].gaps.append(now - last[1])
            rows[-1].gaps.append(now - last[1])
        b = bisect.bisect_right(edges, len(req.hash_ids))
        rows[b].requests += 1
        rows[-1].requests += 1
        pending[session] = (b, now)
    return rows


def _print_returns(rows: Sequence[ReturnRow]) -> None:
    print("| request blocks | requests | session back | back within 120 s | median gap |")
    print("|---|---|---|---|---|")
    for r in rows:
        med = "-" if r.median_gap is None else f"{r.median_gap:.0f} s"
        print(f"| {r.label} | {r.requests:,} | {100 * r.back:.1f}% | "
              f"{100 * r.back_within(120.0):.1f}% | {med} |")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvstore.replay.ceiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="Mooncake JSONL trace (.gz or not)")
    p.add_argument("--hbm-blocks", type=block_counts, default=[1000], metavar="N[,N...]")
    p.add_argument("--oracle-s", type=float, action="append", default=[], metavar="S",
                   help="add online workload with a perfect 'back within S s' bit (repeatable)")
    p.add_argument("--returns", action="store_true",
                   help="print how often sessions come back, per request length")
    args = p.parse_args(argv)
    try:
        requests = load_trace(args.trace)
        if args.returns:
            _print_returns(returns_by_length(requests))
            print()
        rows = []
        for blocks in args.hbm_blocks:
            if blocks < 1:
                raise ValueError(f"--hbm-blocks must be >= 1, got {blocks}")
            budget = [TierBudget("hbm", blocks, DEFAULT_BANDWIDTH["hbm"])]
            online, fitted = in_sample(requests, budget)
            extra = [oracle(requests, budget, s).hit_rate for s in args.oracle_s]
            rows.append((blocks, online.hit_rate, fitted.hit_rate, extra))
            print(f"{blocks} blocks: online {100 * online.hit_rate:.2f}%  "
                  f"in-sample {100 * fitted.hit_rate:.2f}%"
                  + "".join(f"  oracle {s:g} s {100 * h:.2f}%"
                            for s, h in zip(args.oracle_s, extra, strict=True)),
                  file=sys.stderr, flush=True)
    except (OSError, TraceError, ValueError) as exc:
        print(f"kvstore ceiling: {exc}", file=sys.stderr)
        return 2
    heads = "".join(f" oracle {s:g} s bit |" for s in args.oracle_s)
    print(f"| hbm blocks | workload (online) | workload (in-sample statistics) |{heads}")
    print("|---|---|---|" + "---|" * len(args.oracle_s))
    for blocks, a, b, extra in rows:
        cells = "".join(f" {100 * h:.2f}% |" for h in extra)
        print(f"| {blocks} | {100 * a:.2f}% | {100 * b:.2f}% |{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
