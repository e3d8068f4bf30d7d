"""Fleet replay: one trace over N workers behind a router.

Each worker is the served topology of ``kvstore replay``
(:class:`~kvstore.replay.node.ServedNode`, on the served replay's event loop
:func:`~kvstore.replay.served.play`): vLLM's own prefix cache of ``engine_blocks``
in front (:class:`~kvstore.replay.engine_cache.EngineCache`: every computed or
loaded block enters it, freed blocks are evicted LRU, the connector's holds; no
policy is asked), the sidecar behind it: the server's
:class:`~kvstore.engine.core.Engine` over its own in-memory DRAM / disk / Redis tiers
under the policy, requests timed by the same engine model (prefill rate, decode
time per token, ``max_running``, tier bandwidths; ``--instant`` and the other
options of ``kvstore replay`` apply to every worker alike). There is no GPU tier the
policy manages (``--hbm-blocks`` is refused, :data:`~kvstore.replay.cli.HBM_GONE`).

Each worker publishes what a deployment's pod publishes, on one real
:class:`~kvstore.events.EventBus` (msgpack ``KVEventBatch``, vLLM's wire format, int64
hashes = the trace's block ids): the sidecar engine's placement events (media
``CPU`` / ``STORAGE``) and vLLM's own ``BlockStored`` / ``BlockRemoved`` of its GPU
cache (medium ``GPU``, :class:`~kvstore.replay.engine_events.VllmCacheEvents`),
re-published through the bus after a :class:`~kvstore.events.VllmCacheMirror` as the
server does with the events it ingests from vLLM. The router decodes every batch
with :func:`~kvstore.events.decode_batch` and applies it to one shared
:class:`~kvstore.connectors.router.PrefixIndex` keyed by pod, as a router subscribed
to the fleet would, so its index covers the engines' caches and the sidecars'
tiers. Each worker's bus is flushed before every routing decision (what changed
since the last one is one batch): no propagation delay.

Routers: :mod:`kvstore.replay.routing` (``random``, ``load``, ``prefix``).

Work model, for ``load`` and the load spread: a request costs its worker the
prefill seconds it does not save under the cost model (recompute of the
missed blocks plus the load time of the hit ones), counted when it is scheduled;
a worker works through that work in order, and its outstanding work at time t is
what is left of it. This is the routers' estimate, not the engine model (which
runs up to ``max_running`` requests at once); decode is not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvstore.connectors.router import PrefixIndex
from kvstore.events import (
    EventBus,
    EventsConfig,
    PublishedBatch,
    VllmCacheMirror,
    decode_batch,
)
from kvstore.policies.base import TierSpec
from kvstore.policies.cost import READ_BYTES_PER_S, CostModel, read_bytes_per_s
from kvstore.replay.driver import VirtualClock
from kvstore.replay.engine_events import VllmCacheEvents
from kvstore.replay.node import EngineSidecar, Run, ServedNode, build_sidecar
from kvstore.replay.routing import DEFAULT_MIN_MATCH, ROUTERS, Router, make_router
from kvstore.replay.served import play
from kvstore.replay.served_config import (
    SIDECAR_TIERS,
    ServedConfig,
    check_sidecar_tiers,
    decode_block_ids,
    percentile,
)
from kvstore.replay.trace import Request

__all__ = [
    "ROUTERS", "FleetResult", "IndexFeed", "Worker", "WorkerStats", "add_fleet_arguments",
    "build_fleet", "check_fleet", "format_fleet_table", "replay_fleet", "run_fleet",
    "run_fleet_on",
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
    """One pod: vLLM's prefix cache in front of a sidecar, both publishing through one
    bus into the router's index."""

    def __init__(self, pod: str, policy_name: str, config: ServedConfig, cost: CostModel,
                 index: PrefixIndex,
                 decode_ids: Sequence[tuple[int, ...]] | None = None) -> None:
        check_sidecar_tiers(config.sidecar)
        self.pod = pod
        self.feed = IndexFeed(pod, index)
        clock = VirtualClock()
        self.bus = EventBus(EventsConfig(pod=pod, buffer_steps=1), [self.feed], clock=clock)
        # vLLM's own events, re-published by the sidecar as the server does (app.py)
        self.vllm_cache = VllmCacheMirror()
        bus, mirror = self.bus, self.vllm_cache
        self.engine_events = VllmCacheEvents(
            lambda evs: bus.publish_events(mirror.apply(evs)), cost.block_tokens)
        engine, mover = build_sidecar(policy_name, config.sidecar, cost, clock,
                                      config.model.timed_transfers, config.hold_max_s, None,
                                      self.bus)
        self.engine = engine
        super().__init__(policy_name, config, cost, decode_ids, EngineSidecar(engine, mover),
                         clock, cache_listener=self.engine_events)
        self.budgets = tuple(b for b in config.sidecar if b.blocks > 0)
        self.busy_until = 0.0
        self.work_s = 0.0

    def outstanding_s(self, now: float) -> float:
        return max(0.0, self.busy_until - now)

    async def start(self, run: Run, now: float) -> None:
        await super().start(run, now)
        self.work_s += run.work_s
        self.busy_until = max(now, self.busy_until) + run.work_s

    @property
    def hit_blocks(self) -> int:
        return sum(self.hits.values())


@dataclass(frozen=True, slots=True)
class WorkerStats:
    pod: str
    requests: int
    lookups: int
    hit_blocks: int
    #: Hit blocks per tier: ``engine`` (vLLM's own cache) and each sidecar tier.
    hits_by_tier: dict[str, int]
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
    engine_blocks: int
    #: The sidecar's tiers per worker.
    tiers: dict[str, int]
    hold_budget_blocks: int
    requests: int
    lookups: int
    hit_blocks: int
    hit_rate: float
    #: Share of looked-up blocks hit on each tier: ``engine`` and the sidecar's.
    hit_rate_by_tier: dict[str, float]
    prefill_s_saved: float
    prefill_s_total: float
    ttft_p50_s: float
    ttft_p99_s: float
    holds_made: int
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
            "engine_blocks": self.engine_blocks, "tiers_per_worker": self.tiers,
            "hold_budget_blocks": self.hold_budget_blocks, "requests": self.requests,
            "lookups": self.lookups, "hit_blocks": self.hit_blocks,
            "hit_rate": self.hit_rate, "hit_rate_by_tier": self.hit_rate_by_tier,
            "prefill_s_saved": self.prefill_s_saved, "prefill_s_total": self.prefill_s_total,
            "ttft_p50_s": self.ttft_p50_s, "ttft_p99_s": self.ttft_p99_s,
            "holds_made": self.holds_made, "request_spread": self.request_spread,
            "work_spread": self.work_spread,
            "per_worker": [w.to_json() for w in self.workers], "elapsed_s": self.elapsed_s,
        }


def build_fleet(n: int, policy: str, config: ServedConfig, cost: CostModel,
                decode_ids: Sequence[tuple[int, ...]] | None = None
                ) -> tuple[list[Worker], PrefixIndex]:
    """``n`` workers (pods ``w0``..) of ``config`` each, publishing into one fresh router
    index; ``decode_ids``: the trace's (:func:`decode_block_ids`), for decode saves."""
    if n < 1:
        raise ValueError(f"a fleet needs at least 1 worker, got {n}")
    index = PrefixIndex()
    return [Worker(f"w{i}", policy, config, cost, index, decode_ids) for i in range(n)], index


def replay_fleet(trace: Sequence[Request], workers: int, router: str, policy: str,
                 config: ServedConfig, cost: CostModel | None = None, seed: int = 0,
                 progress: Callable[[int], None] | None = None,
                 min_match: float = DEFAULT_MIN_MATCH) -> FleetResult:
    """Replay ``trace`` (timestamp order) over ``workers`` pods of ``config`` behind
    ``router``."""
    cost = cost or CostModel()
    decode_ids = decode_block_ids(trace, cost.block_tokens) if config.decode_saves else None
    fleet, index = build_fleet(workers, policy, config, cost, decode_ids)
    specs = [TierSpec(b.name, b.blocks, read_bytes_per_s(b.name)) for b in fleet[0].budgets]
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
        for w in fleet:  # the router has seen every event so far
            w.bus.flush()
        return router.pick(req, fleet, now)

    await play(trace, fleet, pick, progress)
    for w in fleet:
        w.bus.flush()
    return _result(router_name, fleet, time.perf_counter() - start)


def _result(router: str, fleet: Sequence[Worker], elapsed_s: float) -> FleetResult:
    first = fleet[0]
    names = ["engine", *(b.name for b in first.budgets)]
    lookups = sum(w.lookups for w in fleet)
    by_tier = [sum(w.hits[t] for w in fleet) for t in names]
    hits = sum(by_tier)
    lk = max(lookups, 1)
    stats = tuple(
        WorkerStats(w.pod, w.requests, w.lookups, w.hit_blocks,
                    {t: w.hits[t] for t in names}, w.work_s, w.saved_s,
                    w.feed.batches, w.feed.bytes, w.feed.gaps)
        for w in fleet)
    ttft = [t for w in fleet for t in w.ttft]
    cfg = first.config
    return FleetResult(
        router=router, policy=first.policy, engine_blocks=cfg.engine_blocks,
        tiers={b.name: b.blocks for b in first.budgets},
        hold_budget_blocks=cfg.hold_budget_blocks,
        requests=sum(w.requests for w in fleet), lookups=lookups, hit_blocks=hits,
        hit_rate=hits / lk,
        hit_rate_by_tier={n: h / lk for n, h in zip(names, by_tier, strict=True)},
        prefill_s_saved=sum(w.saved_s for w in fleet),
        prefill_s_total=sum(w.total_s for w in fleet),
        ttft_p50_s=percentile(ttft, 0.5), ttft_p99_s=percentile(ttft, 0.99),
        holds_made=sum(w.cache.holds_made for w in fleet), workers=stats,
        elapsed_s=elapsed_s)


# -- command line -------------------------------------------------------------------------
def format_fleet_table(results: Sequence[FleetResult]) -> str:
    """One row per router and policy: hits by tier, prefill saved, TTFT, load spread."""
    tiers = [t for t in SIDECAR_TIERS if any(t in r.tiers for r in results)]
    head = ["router", "policy", "hit rate", "from engine", *[f"from {t}" for t in tiers],
            "prefill s saved", "saved %", "TTFT p50 s", "TTFT p99 s", "requests per worker",
            "req max/mean", "work max/mean"]
    rows = [head]
    for r in results:
        per = [w.requests for w in r.workers]
        rows.append([
            r.router, r.policy, f"{100 * r.hit_rate:.2f}%",
            *[f"{100 * r.hit_rate_by_tier.get(t, 0.0):.2f}%" for t in ("engine", *tiers)],
            f"{r.prefill_s_saved:.0f}",
            f"{100 * r.prefill_s_saved / max(r.prefill_s_total, 1e-9):.1f}%",
            f"{r.ttft_p50_s:.2f}", f"{r.ttft_p99_s:.2f}",
            " / ".join(str(n) for n in per), f"{r.request_spread:.2f}", f"{r.work_spread:.2f}",
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workers N``, ``--router NAME [NAME ...]``, ``--min-match F`` (for
    ``kvstore replay``, whose other options configure each worker)."""
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="replay over N simulated workers behind a router (each the "
                             "served topology of the other options, one value per "
                             "capacity)")
    parser.add_argument("--router", nargs="+", choices=ROUTERS, default=list(ROUTERS),
                        help="router(s) to compare (default: all of %(choices)s)")
    parser.add_argument("--min-match", type=float, default=DEFAULT_MIN_MATCH, metavar="F",
                        help="prefix router: share of a request's prefill its cached prefix "
                             "must save to outweigh load (default %(default)s)")


def check_fleet(args: argparse.Namespace, configs: Sequence[ServedConfig]) -> ServedConfig:
    """The one worker configuration of a fleet run, or ``ValueError`` naming the option."""
    if args.workers is None or args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if not 0.0 <= args.min_match <= 1.0:
        raise ValueError(f"--min-match must be in [0, 1], got {args.min_match}")
    if len(configs) != 1:
        raise ValueError(f"the fleet replay takes one value per capacity option, got "
                         f"{len(configs)} configurations")
    for opt in ("server", "belady", "belady_bypass", "plot"):
        if getattr(args, opt, None):
            raise ValueError(f"--{opt.replace('_', '-')} does not apply to the fleet replay "
                             "(--workers)")
    return configs[0]


def run_fleet(args: argparse.Namespace, names: Sequence[str], config: ServedConfig,
              trace: Sequence[Request], cost: CostModel, progress: bool) -> int:
    """Each policy under each router (``args.router``) over ``args.workers`` pods of
    ``config``; prints the table, writes ``args.json`` if given."""
    from tqdm import tqdm

    results = []
    for name in names:
        for router in args.router:
            with tqdm(total=len(trace), desc=f"{router} {name} x{args.workers}", unit="req",
                      disable=not progress, leave=False) as bar:
                results.append(replay_fleet(trace, args.workers, router, name, config, cost,
                                            args.seed, bar.update, args.min_match))
    print(format_fleet_table(results))
    if args.json:
        model = config.model
        meta = {"trace": str(args.trace), "requests": len(trace), "workers": args.workers,
                "seed": args.seed, "min_match": args.min_match,
                "engine_blocks": config.engine_blocks,
                "tiers_per_worker": {b.name: b.blocks for b in config.sidecar},
                "hold_budget_blocks": config.hold_budget_blocks,
                "engine_model": {"prefill_tokens_per_s": model.prefill_tokens_per_s,
                                 "time_per_output_token_s": model.time_per_output_token_s,
                                 "max_running": model.max_running,
                                 "timed_transfers": model.timed_transfers,
                                 "hold_max_s": config.hold_max_s,
                                 "decode_saves": config.decode_saves,
                                 "trust_end": config.trust_end,
                                 "send_then": config.send_then},
                "cost_model": {"prefill_tokens_per_s": cost.prefill_tokens_per_s,
                               "block_tokens": cost.block_tokens,
                               "block_bytes": cost.block_bytes,
                               "read_bytes_per_s": READ_BYTES_PER_S}}
        doc = {"meta": meta, "results": [r.to_json() for r in results]}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0
