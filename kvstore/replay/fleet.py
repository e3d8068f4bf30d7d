"""Fleet replay: one trace over N workers behind a router.

Each worker is a served node (:class:`~kvstore.replay.node.ServedNode`, the per-request
path of ``kvstore replay``): the server's :class:`~kvstore.engine.core.Engine` over
its own in-memory tiers and policy, whose placement events go through a real
:class:`~kvstore.events.EventBus` (one msgpack ``KVEventBatch`` per request,
vLLM's wire format, int64 hashes). The event loop is the served replay's
(:func:`~kvstore.replay.served.play`); the router picks a worker at each request's
arrival. The fleet's configuration is the untimed sidecar alone
(:func:`~kvstore.replay.served.sidecar_alone`): no engine cache in front (the GPU is a
policy-managed ``hbm`` tier, ``--hbm-blocks``), requests take no time, no decode
saves, the trace's ``end`` trusted, lookups without ``then``. As everywhere in the
served replay, only a prompt's full blocks are looked up and saved, and saves are
the connector's (no spill). The router decodes every batch
with :func:`~kvstore.events.decode_batch` and applies it to one shared
:class:`~kvstore.connectors.router.PrefixIndex` keyed by pod, as a router
subscribed to the fleet would. Batches are delivered before the next request
is routed (no propagation delay).

Routers: :mod:`kvstore.replay.routing` (``random``, ``load``, ``prefix``).

Work model, for ``load`` and the load spread: a request costs its worker the
prefill seconds it does not save under the cost model (recompute of the
missed blocks plus the load time of the hit ones); a worker works through its
requests in arrival order, and its outstanding work at time t is what is left
of that queue. Decode is not modelled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvstore import policies
from kvstore.connectors.router import PrefixIndex
from kvstore.events import EventBus, EventsConfig, PublishedBatch, decode_batch
from kvstore.policies.base import TierSpec
from kvstore.policies.cost import READ_BYTES_PER_S, CostModel, read_bytes_per_s
from kvstore.replay.driver import TierBudget, VirtualClock
from kvstore.replay.node import EngineSidecar, Run, ServedNode, build_sidecar
from kvstore.replay.routing import DEFAULT_MIN_MATCH, ROUTERS, Router, make_router
from kvstore.replay.served import play
from kvstore.replay.served_config import ServedConfig, sidecar_alone
from kvstore.replay.trace import Request

__all__ = [
    "ROUTERS", "FleetResult", "IndexFeed", "Worker", "WorkerStats", "add_fleet_arguments",
    "build_fleet", "format_fleet_table", "main", "replay_fleet", "run_fleet", "run_fleet_on",
]


class IndexFeed:
    """A bus publisher that decodes each batch into the router's shared index."""

    def __init__(self, pod: str, index: PrefixIndex) -> None:
        self.pod = pod
        self.index = index
        self.next_seq = 0
        self.batches = 0
        self.events = 0
        self.bytes = 0
        self.gaps = 0

    async def start(self) -> None:
        return None

    def publish(self, batch: PublishedBatch) -> None:
        if batch.seq != self.next_seq:
            self.gaps += 1
        self.next_seq = batch.seq + 1
        events = decode_batch(batch.payload).events
        self.index.apply(self.pod, events)
        self.batches += 1
        self.events += len(events)
        self.bytes += len(batch.payload)

    async def close(self) -> None:
        return None


class Worker(ServedNode):
    """One sidecar: a served node whose engine's events go through a bus feeding the
    router."""

    def __init__(self, pod: str, policy_name: str, budgets: Sequence[TierBudget],
                 cost: CostModel, index: PrefixIndex,
                 config: ServedConfig | None = None) -> None:
        self.pod = pod
        self.feed = IndexFeed(pod, index)
        clock = VirtualClock()
        self.bus = EventBus(EventsConfig(pod=pod, buffer_steps=1), [self.feed], clock=clock)
        cfg = config or sidecar_alone(budgets)
        engine, mover = build_sidecar(policy_name, cfg.sidecar, cost, clock,
                                      cfg.model.timed_transfers, cfg.hold_max_s, None, self.bus)
        self.engine = engine
        super().__init__(policy_name, cfg, cost, None, EngineSidecar(engine, mover), clock)
        self.budgets = tuple(b for b in cfg.sidecar if b.blocks > 0)
        self.busy_until = 0.0
        self.work_s = 0.0

    def outstanding_s(self, now: float) -> float:
        return max(0.0, self.busy_until - now)

    async def start(self, run: Run, now: float) -> None:
        await super().start(run, now)
        self.work_s += run.work_s
        self.busy_until = max(now, self.busy_until) + run.work_s

    async def finish(self, run: Run, now: float) -> float:
        held = await super().finish(run, now)
        self.bus.flush()
        return held

    @property
    def hit_blocks(self) -> int:
        return sum(self.hits.values())


@dataclass(frozen=True, slots=True)
class WorkerStats:
    pod: str
    requests: int
    lookups: int
    hit_blocks: int
    #: Prefill seconds the worker computed (its misses, plus load time of its hits).
    work_s: float
    prefill_s_saved: float
    event_batches: int
    event_bytes: int
    event_gaps: int

    def to_json(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__slots__}


def _spread(values: Sequence[float]) -> float:
    """max / mean (1.0 is perfectly even)."""
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


@dataclass(frozen=True, slots=True)
class FleetResult:
    router: str
    policy: str
    tiers: dict[str, int]
    requests: int
    lookups: int
    hit_blocks: int
    hit_rate: float
    hit_rate_by_tier: dict[str, float]
    prefill_s_saved: float
    prefill_s_total: float
    workers: tuple[WorkerStats, ...]
    elapsed_s: float = 0.0

    @property
    def request_spread(self) -> float:
        """max / mean requests per worker."""
        return _spread([w.requests for w in self.workers])

    @property
    def work_spread(self) -> float:
        """max / mean prefill seconds computed per worker."""
        return _spread([w.work_s for w in self.workers])

    def to_json(self) -> dict[str, object]:
        return {
            "router": self.router, "policy": self.policy, "workers": len(self.workers),
            "tiers_per_worker": self.tiers, "requests": self.requests,
            "lookups": self.lookups, "hit_blocks": self.hit_blocks,
            "hit_rate": self.hit_rate, "hit_rate_by_tier": self.hit_rate_by_tier,
            "prefill_s_saved": self.prefill_s_saved, "prefill_s_total": self.prefill_s_total,
            "request_spread": self.request_spread, "work_spread": self.work_spread,
            "per_worker": [w.to_json() for w in self.workers], "elapsed_s": self.elapsed_s,
        }


def build_fleet(n: int, policy: str, budgets: Sequence[TierBudget],
                cost: CostModel) -> tuple[list[Worker], PrefixIndex]:
    """``n`` workers (pods ``w0``..) publishing into one fresh router index."""
    if n < 1:
        raise ValueError(f"a fleet needs at least 1 worker, got {n}")
    index = PrefixIndex()
    return [Worker(f"w{i}", policy, budgets, cost, index) for i in range(n)], index


def replay_fleet(trace: Sequence[Request], workers: int, router: str, policy: str,
                 budgets: Sequence[TierBudget], cost: CostModel | None = None, seed: int = 0,
                 progress: Callable[[int], None] | None = None,
                 min_match: float = DEFAULT_MIN_MATCH) -> FleetResult:
    """Replay ``trace`` (timestamp order) over ``workers`` sidecars behind ``router``."""
    cost = cost or CostModel()
    fleet, index = build_fleet(workers, policy, budgets, cost)
    specs = [TierSpec(b.name, b.blocks, read_bytes_per_s(b.name)) for b in budgets]
    chooser = make_router(router, index, cost, specs, seed, min_match)
    return run_fleet_on(trace, fleet, chooser, router, progress)


def run_fleet_on(trace: Sequence[Request], fleet: Sequence[Worker], router: Router,
                 router_name: str,
                 progress: Callable[[int], None] | None = None) -> FleetResult:
    """Replay over an existing fleet (tests inspect the workers and index afterwards)."""
    return asyncio.run(_run_fleet(trace, fleet, router, router_name, progress))


async def _run_fleet(trace: Sequence[Request], fleet: Sequence[Worker], router: Router,
                     router_name: str, progress: Callable[[int], None] | None) -> FleetResult:
    start = time.perf_counter()

    def pick(req: Request, now: float) -> int:
        return router.pick(req, fleet, now)

    await play(trace, fleet, pick, progress)
    return _result(router_name, fleet, time.perf_counter() - start)


def _result(router: str, fleet: Sequence[Worker], elapsed_s: float) -> FleetResult:
    first = fleet[0]
    names = [b.name for b in first.budgets]
    lookups = sum(w.lookups for w in fleet)
    by_tier = [sum(w.hits[t] for w in fleet) for t in names]
    hits = sum(by_tier)
    lk = max(lookups, 1)
    stats = tuple(
        WorkerStats(w.pod, w.requests, w.lookups, w.hit_blocks, w.work_s, w.saved_s,
                    w.feed.batches, w.feed.bytes, w.feed.gaps)
        for w in fleet)
    return FleetResult(
        router=router, policy=first.policy, tiers={b.name: b.blocks for b in first.budgets},
        requests=sum(w.requests for w in fleet), lookups=lookups, hit_blocks=hits,
        hit_rate=hits / lk,
        hit_rate_by_tier={n: h / lk for n, h in zip(names, by_tier, strict=True)},
        prefill_s_saved=sum(w.saved_s for w in fleet),
        prefill_s_total=sum(w.total_s for w in fleet), workers=stats, elapsed_s=elapsed_s)


# -- command line -------------------------------------------------------------------------
def format_fleet_table(results: Sequence[FleetResult]) -> str:
    head = ["router", "policy", "hit rate", "prefill s saved", "saved %",
            "requests per worker", "req max/mean", "work max/mean"]
    rows = [head]
    for r in results:
        per = [w.requests for w in r.workers]
        rows.append([
            r.router, r.policy, f"{100 * r.hit_rate:.2f}%", f"{r.prefill_s_saved:.0f}",
            f"{100 * r.prefill_s_saved / max(r.prefill_s_total, 1e-9):.1f}%",
            " / ".join(str(n) for n in per), f"{r.request_spread:.2f}", f"{r.work_spread:.2f}",
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workers N`` and ``--router NAME [NAME ...]`` (for ``kvstore replay``)."""
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="replay over N simulated workers behind a router")
    parser.add_argument("--router", nargs="+", choices=ROUTERS, default=list(ROUTERS),
                        help="router(s) to compare (default: all of %(choices)s)")
    parser.add_argument("--min-match", type=float, default=DEFAULT_MIN_MATCH, metavar="F",
                        help="prefix router: share of a request's prefill its cached prefix "
                             "must save to outweigh load (default %(default)s)")


def _first(value: int | Sequence[int]) -> int:
    if isinstance(value, int):
        return value
    if len(value) != 1:
        raise ValueError(f"fleet replay takes one capacity per tier, got {list(value)}")
    return value[0]


def run_fleet(args: argparse.Namespace) -> int:
    """Run from parsed arguments: ``trace``, ``workers``, ``router``, ``policy`` (list or
    None), ``hbm_blocks`` / ``dram_blocks`` / ``disk_blocks`` (per worker; an int or a
    one-item list), ``prefill_tps``, ``seed``, ``min_match``, ``json``, ``no_progress``,
    optional ``limit``."""
    from tqdm import tqdm

    from kvstore.replay.trace import TraceError, load_trace

    names = args.policy or ["lru"]
    try:
        if args.workers is None or args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        if not 0.0 <= args.min_match <= 1.0:
            raise ValueError(f"--min-match must be in [0, 1], got {args.min_match}")
        for name in names:
            if name not in policies.available():
                raise ValueError(f"unknown policy {name!r}; valid: "
                                 f"{', '.join(policies.available())}")
        caps = {"hbm": _first(args.hbm_blocks), "dram": _first(args.dram_blocks),
                "disk": _first(args.disk_blocks)}
        budgets = [TierBudget(t, n) for t, n in caps.items() if n > 0]
        if not budgets:
            raise ValueError("every tier has 0 blocks; give --hbm-blocks N")
        cost = CostModel(prefill_tokens_per_s=args.prefill_tps)
        trace = load_trace(args.trace)
    except (OSError, TraceError, ValueError) as exc:
        print(f"kvstore replay: {exc}", file=sys.stderr)
        return 2
    limit = getattr(args, "limit", None)
    if limit:
        trace = trace[:limit]
    show = not args.no_progress and sys.stderr.isatty()
    results = []
    for name in names:
        for router in args.router:
            with tqdm(total=len(trace), desc=f"{router} {name} x{args.workers}", unit="req",
                      disable=not show, leave=False) as bar:
                results.append(replay_fleet(trace, args.workers, router, name, budgets, cost,
                                            args.seed, bar.update, args.min_match))
    print(format_fleet_table(results))
    if args.json:
        meta = {"trace": str(args.trace), "requests": len(trace), "workers": args.workers,
                "seed": args.seed, "min_match": args.min_match, "tiers_per_worker": caps,
                "cost_model": {"prefill_tokens_per_s": cost.prefill_tokens_per_s,
                               "block_tokens": cost.block_tokens,
                               "block_bytes": cost.block_bytes,
                               "read_bytes_per_s": READ_BYTES_PER_S}}
        doc = {"meta": meta, "results": [r.to_json() for r in results]}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvstore.replay.fleet",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="Mooncake JSONL trace (.gz or not)")
    add_fleet_arguments(p)
    p.set_defaults(workers=4)
    p.add_argument("--policy", action="append", default=None,
                   help=f"policy per worker, repeatable (default lru); one of "
                        f"{', '.join(policies.available())}")
    p.add_argument("--hbm-blocks", type=int, default=1000, metavar="N", help="per worker")
    p.add_argument("--dram-blocks", type=int, default=0, metavar="N", help="per worker")
    p.add_argument("--disk-blocks", type=int, default=0, metavar="N", help="per worker")
    p.add_argument("--prefill-tps", type=float, default=CostModel().prefill_tokens_per_s,
                   help="prefill tokens/s of the cost model (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random router")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="replay only the first N requests")
    p.add_argument("--json", metavar="OUT", help="write results as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return run_fleet(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
