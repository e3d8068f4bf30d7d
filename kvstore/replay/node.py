"""One request as a vLLM worker with the connector plays it (the per-request path).

A :class:`ServedNode` is one engine: its own prefix cache
(:class:`~kvstore.replay.engine_cache.EngineCache`) in front of the sidecar, the
server's :class:`~kvstore.engine.core.Engine` over in-memory tiers with its mover on
the virtual clock (:mod:`kvstore.replay.timed_mover`). Its three phases are the
request's, called by the event loop (:mod:`kvstore.replay.served`) at their times:

- :meth:`ServedNode.start` (scheduled): the engine's own prefix hit, the lookup of the
  whole chain of full blocks with the request id, session, workload, prompt length and
  the client's ``then`` / ``tool``; the served prefix past the engine's hit is loaded
  (each block at its tier's bandwidth), the rest computed;
- :meth:`ServedNode.prefill_done`: the blocks the lookup said to store are saved
  (through :meth:`ServedNode.save`, the one store call: the connector's
  Reserve/Commit semantics, no spill);
- :meth:`ServedNode.finish`: the decode blocks are saved, the trace's retention and
  the turn's hint sent, the engine's keep granted within the hold budget.

The served replay runs one node; the fleet replay (:mod:`kvstore.replay.fleet`) runs
one per worker, the router choosing at arrival. Hits are counted per tier name: the
engine's (``engine``) and each sidecar tier's.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstore import policies
from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine, tier_specs
from kvstore.errors import TierFull
from kvstore.events import EventSink
from kvstore.policies import Hint, TierSpec
from kvstore.policies.cost import CostModel, read_bytes_per_s
from kvstore.replay.driver import MEDIA, NAMESPACE, TierBudget, VirtualClock
from kvstore.replay.engine_cache import CacheListener, EngineCache
from kvstore.replay.served_config import (
    SIDECAR_TIERS,
    ServedConfig,
    ServedResult,
    client_then,
    percentile,
)
from kvstore.replay.timed_mover import TimedMover
from kvstore.replay.trace import Request
from kvstore.tiers.memory import MemoryTier
from kvstore.types import Medium

__all__ = ["EngineSidecar", "Run", "ServedNode", "Sidecar", "build_sidecar", "engine_node"]


def build_sidecar(policy: str, budgets: Sequence[TierBudget], cost: CostModel,
                  clock: VirtualClock, timed: bool, hold_max_s: float,
                  options: Mapping[str, Any] | None = None,
                  events: EventSink | None = None) -> tuple[Engine, TimedMover]:
    """The server's engine over in-memory sidecar tiers, its mover on ``clock``;
    ``options`` go to the policy's constructor, ``events`` is the engine's event sink."""
    tiers = [MemoryTier(b.blocks, name=b.name, medium=MEDIA[b.name])
             for b in budgets if b.blocks > 0]
    if not tiers:
        raise ValueError("the sidecar has no tier: give --dram-blocks N (and/or "
                         "--disk-blocks / --redis-blocks)")
    pol = policies.create(policy, tier_specs(tiers), cost=cost, hbm_keep_max_s=hold_max_s,
                          **(options or {}))
    engine = Engine(tiers, pol, events, clock=clock, cost=cost, write_back=True,
                    max_hashes=1 << 30, max_block_bytes=1 << 30)
    engine.set_geometry(NAMESPACE, cost.block_bytes, cost.block_tokens, stored_bytes=1)

    def set_clock(t: float) -> None:
        clock.t = t

    bw: Callable[[str], float] = read_bytes_per_s if timed else (lambda _t: math.inf)
    mover = TimedMover(engine.placement.run_transfer, clock, set_clock, cost.block_bytes, bw)
    engine.use_mover(mover)
    return engine, mover


class Sidecar(Protocol):
    """What a node's connector talks to: the engine in this process, or a server."""

    async def lookup(self, run: Run, then: str, tool: str, engine_hit_tokens: int
                     ) -> tuple[Sequence[Medium], int, float]:
        """(media of the served prefix of ``run.hashes``, blocks after it to store, keep)."""
        ...

    async def save(self, run: Run, blocks: list[NewBlock]) -> None: ...

    async def retain(self, run: Run, hashes: list[bytes], ttl_s: float) -> None: ...

    async def hint(self, run: Run, hint: Hint) -> None: ...

    async def run_until(self, now: float) -> None:
        """Background transfers that end by ``now`` complete."""
        ...

    async def run_pending(self) -> None: ...

    def moved_bytes(self) -> dict[tuple[str, str], int]: ...


class EngineSidecar:
    """The server's engine in this process, its mover on the node's virtual clock."""

    def __init__(self, engine: Engine, mover: TimedMover) -> None:
        self.engine = engine
        self.mover = mover

    async def lookup(self, run: Run, then: str, tool: str, engine_hit_tokens: int
                     ) -> tuple[Sequence[Medium], int, float]:
        req = run.req
        found = await self.engine.serve_lookup(NAMESPACE, run.hashes, req.session_id or "",
                                               req.workload or "", request_id=run.rid,
                                               num_tokens=req.input_length, then=then,
                                               tool=tool, engine_hit_tokens=engine_hit_tokens)
        return found.media, found.store, found.keep_s

    # the one store call: the connector's Reserve/Commit semantics (no spill)
    async def save(self, run: Run, blocks: list[NewBlock]) -> None:
        req = run.req
        with contextlib.suppress(TierFull):  # no room at all: a skipped save, as vLLM's
            await self.engine.put(NAMESPACE, blocks, req.session_id or "", req.workload or "",
                                  request_id=run.rid, spill=False)

    async def retain(self, run: Run, hashes: list[bytes], ttl_s: float) -> None:
        self.engine.retain(NAMESPACE, hashes, ttl_s)

    async def hint(self, run: Run, hint: Hint) -> None:
        self.engine.hint(hint, NAMESPACE, run.rid)

    async def run_until(self, now: float) -> None:
        await self.mover.run_until(now)

    async def run_pending(self) -> None:
        await self.mover.run_pending()

    def moved_bytes(self) -> dict[tuple[str, str], int]:
        return dict(self.engine.stats.moved_bytes)


@dataclass(slots=True)
class Run:
    """One request's state between its phases."""

    req: Request
    rid: str
    arrival: float
    after_tool: bool
    #: Index of the request in the trace (its decode ids).
    index: int = 0
    hashes: list[bytes] = field(default_factory=list)
    engine_blocks: tuple[int, ...] = ()
    served: int = 0
    store: int = 0
    keep_s: float = 0.0
    prefill_end: float = 0.0
    finish: float = 0.0
    #: Prefill seconds the request cost its engine under the cost model (recompute of
    #: the missed blocks plus the load time of the hit ones).
    work_s: float = 0.0


class ServedNode:
    """One engine (its prefix cache) with the connector in front of its sidecar."""

    def __init__(self, policy: str, config: ServedConfig, cost: CostModel,
                 decode_ids: Sequence[tuple[int, ...]] | None, sidecar: Sidecar,
                 clock: VirtualClock, tiers: Sequence[str] | None = None,
                 cache_listener: CacheListener | None = None) -> None:
        """``sidecar`` runs on ``clock`` (the node advances it); ``tiers``: the sidecar's
        tier names (default ``config.sidecar``'s); ``cache_listener`` hears what the
        engine's prefix cache publishes (vLLM's GPU events)."""
        self.policy = policy
        self.config = config
        self.cost = cost
        self.model = config.model
        self.clock = clock
        self.sidecar = sidecar
        self.cache = EngineCache(config.engine_blocks, config.hold_budget_blocks,
                                 config.hold_max_s, cache_listener)
        #: Per request (by trace index), its decode block ids; None: no decode saves.
        self.decode_ids = decode_ids
        names = (list(tiers) if tiers is not None
                 else [b.name for b in config.sidecar if b.blocks > 0])
        self._tier_of = {MEDIA.get(t, Medium.CPU): t for t in names}
        self._block_s = cost.recompute_s(cost.block_tokens)
        timed = config.model.timed_transfers
        self._load_s = {t: (cost.block_bytes / read_bytes_per_s(t) if timed else 0.0)
                        for t in names}
        self._saved_s = {t: cost.saved_s(TierSpec(t, 0, read_bytes_per_s(t))) for t in names}
        self.hits = {"engine": 0, **{t: 0 for t in SIDECAR_TIERS}, **{t: 0 for t in names}}
        self.lookups = 0
        self.saved_s = 0.0
        self.total_s = 0.0
        self.decode_saved = 0
        self.ttft: list[float] = []
        self.ttft_after_tool: list[float] = []
        #: The event loop's: requests waiting for a slot, requests running.
        self.waiting: deque[int] = deque()
        self.running = 0
        self._payload = b"\0"

    @property
    def requests(self) -> int:
        """Requests started here so far."""
        return len(self.ttft)

    async def advance(self, now: float) -> None:
        """The clock reaches ``now``: the mover's transfers that end by then complete,
        holds that end by then are released."""
        clock = self.clock
        if now > clock.t:
            clock.t = now
        await self.sidecar.run_until(clock.t)
        self.cache.expire(clock.t)

    async def save(self, run: Run, blocks: list[NewBlock]) -> None:
        """The one store call (the sidecar's: the connector's, no spill)."""
        if blocks:
            await self.sidecar.save(run, blocks)

    # -- the phases of a request ---------------------------------------------------------
    async def start(self, run: Run, now: float) -> None:
        req = run.req
        ids = req.hash_ids
        tokens = self.cost.block_tokens
        full = min(req.input_length // tokens, len(ids))
        # vLLM computes a prompt's last token itself: no hit (its own or a load) reaches it
        reach = min(full, (req.input_length - 1) // tokens) if req.input_length else 0
        e = self.cache.match(ids[:reach])
        # only full blocks have a hash: the connector looks up and saves those alone
        run.hashes = [i.to_bytes(8, "big") for i in ids[:full]]
        then, tool = (client_then(req, self.config.trust_end) if self.config.send_then
                      else ("", ""))
        media, store, keep_s = await self.sidecar.lookup(run, then, tool, e * tokens)
        await self.sidecar.run_until(now)
        s = len(media)
        run.served, run.store, run.keep_s = s, store, keep_s
        hits = self.hits
        hits["engine"] += e
        block_s = self._block_s
        before = self.total_s - self.saved_s
        saved = self.saved_s + e * block_s
        load_s = 0.0
        tier_of, saved_of, load_of = self._tier_of, self._saved_s, self._load_s
        for m in media[e:reach]:
            t = tier_of[m]
            hits[t] += 1
            saved += saved_of[t]
            load_s += load_of[t]
        self.saved_s = saved
        self.lookups += len(ids)
        self.total_s += len(ids) * block_s
        run.work_s = self.total_s - saved - before
        computed = max(0, req.input_length - max(e, min(s, reach)) * tokens)
        prefill_s = load_s + computed / self.model.prefill_tokens_per_s
        tpot = self.model.time_per_output_token_s
        ttft = now - run.arrival + prefill_s + tpot
        self.ttft.append(ttft)
        if run.after_tool:
            self.ttft_after_tool.append(ttft)
        run.engine_blocks = self.cache.acquire(ids[:full],
                                               partial=req.input_length > full * tokens)
        run.prefill_end = now + prefill_s
        run.finish = run.prefill_end + req.output_length * tpot

    async def prefill_done(self, run: Run) -> None:
        hashes = run.hashes
        start, stop = run.served, run.served + run.store
        if start >= stop:
            return
        tokens = self.cost.block_tokens
        payload = self._payload
        await self.save(run, [NewBlock(hashes[j], hashes[j - 1] if j else None, (), payload,
                                       tokens)
                              for j in range(start, stop)])

    async def finish(self, run: Run, now: float) -> float:
        """The request finished at ``now``; returns the hold its blocks got (0: none)."""
        req = run.req
        dec = self.decode_ids[run.index] if self.decode_ids is not None else ()
        if dec:
            tokens = self.cost.block_tokens
            n0 = min(req.input_length // tokens, len(req.hash_ids))
            last = req.hash_ids[n0 - 1] if n0 else None
            parent = last.to_bytes(8, "big") if last is not None else None
            blocks = []
            for d in dec:
                h = d.to_bytes(8, "big")
                blocks.append(NewBlock(h, parent, (), self._payload, tokens))
                parent = h
            await self.save(run, blocks)
            self.decode_saved += len(blocks)
            run.engine_blocks = self.cache.extend(run.engine_blocks, dec, last)
        if req.cache_ttl_s:
            n = len(run.hashes) if req.cache_blocks is None else min(req.cache_blocks,
                                                                     len(run.hashes))
            await self.sidecar.retain(run, run.hashes[:n], req.cache_ttl_s)
        then, tool = client_then(req, self.config.trust_end)
        if then:
            await self.sidecar.hint(run, Hint(req.session_id or "", then,
                                              req.workload or "unknown", tool or None))
        held = self.cache.finish(run.rid, run.engine_blocks, run.keep_s, now)
        await self.sidecar.run_until(now)
        return held

    def result(self, elapsed_s: float) -> ServedResult:
        lk = max(self.lookups, 1)
        hits = sum(self.hits.values())
        scale = self.cost.block_bytes  # a stand-in block is one byte
        moved = {f"{s}->{d}": b * scale
                 for (s, d), b in sorted(self.sidecar.moved_bytes().items())}
        loaded = sum(n for t, n in self.hits.items() if t != "engine") * scale
        moved["sidecar->engine"] = loaded
        tiers = {b.name: b.blocks for b in self.config.sidecar if b.blocks > 0}
        at = self.ttft_after_tool
        return ServedResult(
            policy=self.policy, engine_blocks=self.config.engine_blocks, tiers=tiers,
            hold_budget_blocks=self.config.hold_budget_blocks, requests=len(self.ttft),
            lookups=self.lookups, hit_blocks=hits, hit_rate=hits / lk,
            hits_by_tier={t: self.hits[t] / lk for t in ("engine", *SIDECAR_TIERS)},
            prefill_s_saved=self.saved_s, prefill_s_total=self.total_s,
            ttft_p50_s=percentile(self.ttft, 0.5), ttft_p99_s=percentile(self.ttft, 0.99),
            after_tool_ttft_p50_s=percentile(at, 0.5),
            after_tool_ttft_p99_s=percentile(at, 0.99), after_tool_requests=len(at),
            bytes_moved=moved, decode_blocks_saved=self.decode_saved,
            holds_made=self.cache.holds_made, holds_refused=self.cache.holds_refused,
            elapsed_s=elapsed_s)


def engine_node(policy: str, config: ServedConfig, cost: CostModel,
                decode_ids: Sequence[tuple[int, ...]] | None,
                options: Mapping[str, Any] | None = None,
                events: EventSink | None = None,
                clock: VirtualClock | None = None) -> tuple[ServedNode, EngineSidecar]:
    """A node over the server's engine in this process (``options`` go to the policy,
    ``events`` is the engine's event sink)."""
    clock = clock or VirtualClock()
    engine, mover = build_sidecar(policy, config.sidecar, cost, clock,
                                  config.model.timed_transfers, config.hold_max_s, options,
                                  events)
    side = EngineSidecar(engine, mover)
    return ServedNode(policy, config, cost, decode_ids, side, clock), side
