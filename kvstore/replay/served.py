"""The served topology: vLLM's own prefix cache in front, the sidecar behind.

Each request is played as a vLLM worker with the connector plays it:

1. It arrives at its trace time and waits (FIFO) until fewer than ``max_running``
   requests run. Room in the engine cache does not gate it: the traces carry more
   load than one engine of H blocks could run (the agent trace: 385,000 s of
   prefill in 155,000 s), so a request's blocks that find no free room are simply
   not cached (:class:`~kvstore.replay.engine_cache.EngineCache`), and each running
   request prefills at the stated rate (no sharing of the engine's throughput).
2. When it is scheduled, the engine finds its own cached prefix (``engine`` hits,
   no policy asked) and the connector looks the whole chain up in the sidecar,
   with the request's id, session, workload, prompt length and what the client
   says the turn ends with (``then`` / ``tool``, from the trace's ``after``). Blocks
   past the engine's own hit that the sidecar serves are loaded (priced at the
   tier's bandwidth); the rest is computed. As in vLLM, only full blocks have a
   hash (a partial last block is never looked up, saved or hit, but takes an
   engine slot while its request runs), and no hit reaches the prompt's last
   token, which the engine computes itself (``tests/vllm/bench_slice.py`` checks
   this model against a real engine).
3. When the prefill ends (load time + computed tokens / prefill tokens/s) the
   blocks the lookup said to store are saved; the output tokens then fill decode
   blocks (one per ``time_per_output_token`` x block tokens), saved when the
   request finishes, with the turn's hint and the engine's keep (the lookup's
   ``keep_s``, within the hold budget).
4. The sidecar is the server's :class:`~kvstore.engine.core.Engine` over in-memory
   tiers, its mover on the virtual clock (:mod:`kvstore.replay.timed_mover`).

What the client cannot know is not sent: the trace's ``end`` (a session's last
request) becomes a plain ``turn_end`` (a client sees the answer, not that the user
will never come back) unless ``trust_end`` says the trace's client knows it. A
request without ``after`` sends no ``then`` and no hint, as the connector does for a
turn its client did not describe.
Decode blocks are named by the session's next request where it shares this
request's full prompt blocks (the output is sent back as the next prompt), else by
fresh ids nothing asks for again; the name is the content's, not a decision.

Why past ~400 lines: one event loop whose phases (arrive, schedule, prefill end,
finish, hold expiry) share each run's state; the engine cache
(:mod:`~kvstore.replay.engine_cache`) and the timed mover are their own modules.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvstore import policies
from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine, tier_specs
from kvstore.errors import TierFull
from kvstore.policies import Hint, TierSpec
from kvstore.policies.cost import CostModel, read_bytes_per_s
from kvstore.replay.driver import MEDIA, NAMESPACE, TierBudget, VirtualClock
from kvstore.replay.engine_cache import EngineCache
from kvstore.replay.timed_mover import TimedMover
from kvstore.replay.trace import Request
from kvstore.tiers.memory import MemoryTier
from kvstore.turns import AFTER_EVENTS, lookup_then

__all__ = ["DEFAULT_HOLD_MAX_S", "DEFAULT_MAX_RUNNING", "DEFAULT_TPOT_S", "SIDECAR_TIERS",
           "EngineModel", "ServedConfig", "ServedResult", "ServedReplay",
           "client_then", "decode_block_ids", "replay_served", "sidecar_alone"]

#: Sidecar tiers of the served topology, fastest first (the GPU is the engine's).
SIDECAR_TIERS = ("dram", "disk", "redis")
_TIER_OF_MEDIUM = {MEDIA[t]: t for t in SIDECAR_TIERS}


#: Defaults of the engine model and the keeps (the CLI's too).
DEFAULT_TPOT_S = 0.02
DEFAULT_MAX_RUNNING = 64
DEFAULT_HOLD_MAX_S = 10.0


@dataclass(frozen=True, slots=True)
class EngineModel:
    """How long a request takes in the engine (stated, not measured)."""

    #: Prefill throughput for the computed part of a prompt (default: the cost model's).
    prefill_tokens_per_s: float = 10_000.0
    #: Decode time per output token.
    time_per_output_token_s: float = DEFAULT_TPOT_S
    #: Most requests running at once (vLLM's ``max_num_seqs``).
    max_running: int = DEFAULT_MAX_RUNNING
    #: Tier bandwidths apply to loads and to the mover (False: both instant).
    timed_transfers: bool = True

    def __post_init__(self) -> None:
        if not self.prefill_tokens_per_s > 0 or self.time_per_output_token_s < 0:
            raise ValueError(f"engine model: prefill_tokens_per_s {self.prefill_tokens_per_s} "
                             f"must be > 0 and time_per_output_token_s "
                             f"{self.time_per_output_token_s} >= 0")
        if self.max_running < 1:
            raise ValueError(f"engine model: max_running must be >= 1, got {self.max_running}")

    @classmethod
    def instant(cls, max_running: int = 1) -> EngineModel:
        """Requests take no time and transfers are instant (the untimed replay)."""
        return cls(math.inf, 0.0, max_running, timed_transfers=False)


@dataclass(frozen=True, slots=True)
class ServedConfig:
    engine_blocks: int
    sidecar: tuple[TierBudget, ...]
    #: Most engine blocks the connector's keeps hold at once; 0: no holds.
    hold_budget_blocks: int
    #: Cap on one keep (the connector's ``hold_max_ms``).
    hold_max_s: float = DEFAULT_HOLD_MAX_S
    model: EngineModel = field(default_factory=EngineModel)
    decode_saves: bool = True
    trust_end: bool = False
    #: Lookups carry ``then`` / ``tool`` (False: the ablation without them).
    send_then: bool = True


def sidecar_alone(budgets: Sequence[TierBudget]) -> ServedConfig:
    """The sidecar's tiers behind no engine cache, untimed: no decode saves, the trace's
    ``end`` trusted, lookups without ``then`` (``--engine-blocks 0 --instant
    --no-decode-saves --trust-end --no-then``). The "sidecar DRAM alone" tables and the
    profile's capacity curves run this; on a trace whose blocks are all full it gives
    the figures of the untimed single-tier loop it replaced (tests/replay/test_served.py).
    """
    return ServedConfig(0, tuple(budgets), 0, model=EngineModel.instant(),
                        decode_saves=False, trust_end=True, send_then=False)


@dataclass(frozen=True, slots=True)
class ServedResult:
    policy: str
    engine_blocks: int
    tiers: dict[str, int]
    hold_budget_blocks: int
    requests: int
    lookups: int
    hit_blocks: int
    hit_rate: float
    hits_by_tier: dict[str, float]
    prefill_s_saved: float
    prefill_s_total: float
    ttft_p50_s: float
    ttft_p99_s: float
    after_tool_ttft_p50_s: float
    after_tool_ttft_p99_s: float
    after_tool_requests: int
    bytes_moved: dict[str, int]
    decode_blocks_saved: int
    holds_made: int
    holds_refused: int
    elapsed_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy, "engine_blocks": self.engine_blocks, "tiers": self.tiers,
            "hold_budget_blocks": self.hold_budget_blocks, "requests": self.requests,
            "lookups": self.lookups, "hit_blocks": self.hit_blocks, "hit_rate": self.hit_rate,
            "hits_by_tier": self.hits_by_tier, "prefill_s_saved": self.prefill_s_saved,
            "prefill_s_total": self.prefill_s_total, "ttft_p50_s": self.ttft_p50_s,
            "ttft_p99_s": self.ttft_p99_s, "after_tool_ttft_p50_s": self.after_tool_ttft_p50_s,
            "after_tool_ttft_p99_s": self.after_tool_ttft_p99_s,
            "after_tool_requests": self.after_tool_requests, "bytes_moved": self.bytes_moved,
            "decode_blocks_saved": self.decode_blocks_saved, "holds_made": self.holds_made,
            "holds_refused": self.holds_refused, "elapsed_s": self.elapsed_s,
        }


def decode_block_ids(requests: Sequence[Request], block_tokens: int) -> list[tuple[int, ...]]:
    """Per request, the ids of the full blocks its output tokens complete: the prompt's
    full blocks end at ``input_length // block_tokens``, the decode's at
    ``(input + output) // block_tokens``. Named by the session's next request where it
    repeats this one's full prompt blocks, else fresh ids above every trace id."""
    fresh = max((max(r.hash_ids) for r in requests if r.hash_ids), default=0) + 1
    nxt: dict[str, Request] = {}
    out: list[tuple[int, ...]] = [()] * len(requests)
    for i in range(len(requests) - 1, -1, -1):
        r = requests[i]
        n0 = r.input_length // block_tokens
        n1 = (r.input_length + r.output_length) // block_tokens
        n0 = min(n0, len(r.hash_ids))
        nreq = nxt.get(r.session_id) if r.session_id is not None else None
        if n1 > n0:
            named: tuple[int, ...] = ()
            if nreq is not None and nreq.hash_ids[:n0] == r.hash_ids[:n0]:
                named = nreq.hash_ids[n0:n1]
            ids = list(named)
            while len(ids) < n1 - n0:
                ids.append(fresh)
                fresh += 1
            out[i] = tuple(ids)
        if r.session_id is not None:
            nxt[r.session_id] = r
    return out


def client_then(req: Request, trust_end: bool = False) -> tuple[str, str]:
    """(hint event, tool) of what the request's client knows its turn ends with: the
    ``then`` / ``tool`` its lookup carries and the hint its end sends. A client that
    says nothing sends nothing, as the connector does (:mod:`kvstore.turns`; a trace's
    request carries no expected gap, so one without ``after`` is not described). The
    trace's ``end`` is a ``user`` turn unless ``trust_end``."""
    after = req.after
    kind = after.kind if after is not None else "user"
    if kind == "end" and not trust_end:
        kind = "user"
    then = lookup_then(AFTER_EVENTS[kind], after is not None)
    return then, (after.tool or "") if after is not None and then else ""


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return s[k]


def build_sidecar(policy: str, budgets: Sequence[TierBudget], cost: CostModel,
                  clock: VirtualClock, timed: bool, hold_max_s: float,
                  options: Mapping[str, Any] | None = None) -> tuple[Engine, TimedMover]:
    """The server's engine over in-memory sidecar tiers, its mover on ``clock``;
    ``options`` go to the policy's constructor."""
    tiers = [MemoryTier(b.blocks, name=b.name, medium=MEDIA[b.name])
             for b in budgets if b.blocks > 0]
    if not tiers:
        raise ValueError("the sidecar has no tier: give --dram-blocks N (and/or "
                         "--disk-blocks / --redis-blocks)")
    pol = policies.create(policy, tier_specs(tiers), cost=cost, hbm_keep_max_s=hold_max_s,
                          **(options or {}))
    engine = Engine(tiers, pol, None, clock=clock, cost=cost, write_back=True,
                    max_hashes=1 << 30, max_block_bytes=1 << 30)
    engine.set_geometry(NAMESPACE, cost.block_bytes, cost.block_tokens, stored_bytes=1)

    def set_clock(t: float) -> None:
        clock.t = t

    bw: Callable[[str], float] = read_bytes_per_s if timed else (lambda _t: math.inf)
    mover = TimedMover(engine.placement.run_transfer, clock, set_clock, cost.block_bytes, bw)
    engine.use_mover(mover)
    return engine, mover


@dataclass(slots=True)
class _Run:
    req: Request
    rid: str
    arrival: float
    after_tool: bool
    hashes: list[bytes] = field(default_factory=list)
    engine_blocks: tuple[int, ...] = ()
    served: int = 0
    store: int = 0
    keep_s: float = 0.0
    prefill_end: float = 0.0
    finish: float = 0.0


class ServedReplay:
    """Plays a trace through the engine cache in front of the sidecar's engine."""

    def __init__(self, requests: Sequence[Request], policy: str, config: ServedConfig,
                 cost: CostModel, options: Mapping[str, Any] | None = None) -> None:
        for b in config.sidecar:
            if b.name not in SIDECAR_TIERS:
                raise ValueError(f"sidecar tier {b.name!r}: one of {', '.join(SIDECAR_TIERS)}")
        self.requests = requests
        self.policy = policy
        self.config = config
        self.cost = cost
        self.model = config.model
        self.clock = VirtualClock()
        self.engine, self.mover = build_sidecar(policy, config.sidecar, cost, self.clock,
                                                config.model.timed_transfers,
                                                config.hold_max_s, options)
        self.cache = EngineCache(config.engine_blocks, config.hold_budget_blocks,
                                 config.hold_max_s)
        self.decode_ids = (decode_block_ids(requests, cost.block_tokens)
                           if config.decode_saves else [()] * len(requests))
        self._block_s = cost.recompute_s(cost.block_tokens)
        self._load_s = {t: (cost.block_bytes / read_bytes_per_s(t)
                            if config.model.timed_transfers else 0.0) for t in SIDECAR_TIERS}
        self._saved_s = {t: cost.saved_s(TierSpec(t, 0, read_bytes_per_s(t)))
                         for t in SIDECAR_TIERS}
        self.hits = {"engine": 0, **{t: 0 for t in SIDECAR_TIERS}}
        self.lookups = 0
        self.saved_s = 0.0
        self.total_s = 0.0
        self.decode_saved = 0
        self.ttft: list[float] = []
        self.ttft_after_tool: list[float] = []
        self._payload = b"\0"

    # -- the one store call: the connector's Reserve/Commit semantics (no spill) ---------
    async def _save(self, run: _Run, blocks: list[NewBlock]) -> None:
        if not blocks:
            return
        req = run.req
        with contextlib.suppress(TierFull):  # no room at all: a skipped save, as vLLM's
            await self.engine.put(NAMESPACE, blocks, req.session_id or "", req.workload or "",
                                  request_id=run.rid, spill=False)

    # -- the phases of a request ---------------------------------------------------------
    async def _start(self, run: _Run, now: float) -> None:
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
        found = await self.engine.serve_lookup(NAMESPACE, run.hashes, req.session_id or "",
                                               req.workload or "", request_id=run.rid,
                                               num_tokens=req.input_length, then=then,
                                               tool=tool, engine_hit_tokens=e * tokens)
        await self.mover.run_until(now)
        media = found.media
        s = len(media)
        run.served, run.store, run.keep_s = s, found.store, found.keep_s
        hits = self.hits
        hits["engine"] += e
        self.saved_s += e * self._block_s
        load_s = 0.0
        for m in media[e:reach]:
            t = _TIER_OF_MEDIUM[m]
            hits[t] += 1
            self.saved_s += self._saved_s[t]
            load_s += self._load_s[t]
        self.lookups += len(ids)
        self.total_s += len(ids) * self._block_s
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

    async def _prefill_done(self, run: _Run) -> None:
        hashes = run.hashes
        start, stop = run.served, run.served + run.store
        if start >= stop:
            return
        tokens = self.cost.block_tokens
        payload = self._payload
        await self._save(run, [NewBlock(hashes[j], hashes[j - 1] if j else None, (), payload,
                                        tokens)
                               for j in range(start, stop)])

    async def _finish(self, run: _Run, i: int, now: float) -> float:
        req = run.req
        dec = self.decode_ids[i]
        if dec:
            tokens = self.cost.block_tokens
            n0 = min(req.input_length // tokens, len(req.hash_ids))
            parent = req.hash_ids[n0 - 1].to_bytes(8, "big") if n0 else None
            blocks = []
            for d in dec:
                h = d.to_bytes(8, "big")
                blocks.append(NewBlock(h, parent, (), self._payload, tokens))
                parent = h
            await self._save(run, blocks)
            self.decode_saved += len(blocks)
            run.engine_blocks = self.cache.extend(run.engine_blocks, dec)
        if req.cache_ttl_s:
            n = len(run.hashes) if req.cache_blocks is None else min(req.cache_blocks,
                                                                     len(run.hashes))
            self.engine.retain(NAMESPACE, run.hashes[:n], req.cache_ttl_s)
        then, tool = client_then(req, self.config.trust_end)
        if then:
            self.engine.hint(Hint(req.session_id or "", then, req.workload or "unknown",
                                  tool or None), NAMESPACE, run.rid)
        return self.cache.finish(run.rid, run.engine_blocks, run.keep_s, now)

    # -- the event loop ------------------------------------------------------------------
    async def run(self, progress: Callable[[int], None] | None = None) -> ServedResult:
        started = time.perf_counter()
        reqs = self.requests
        last_after: dict[str, str] = {}
        runs: list[_Run] = []
        for i, r in enumerate(reqs):
            prev = last_after.get(r.session_id) if r.session_id is not None else None
            runs.append(_Run(r, f"r{i}", r.timestamp_ms / 1000.0, prev == "tool_call"))
            if r.session_id is not None:
                last_after[r.session_id] = r.after.kind if r.after else ""
        # Events: (time, order, kind, request index); kinds: 0 prefill done, 1 finish,
        # 2 a hold's end.
        events: list[tuple[float, int, int, int]] = []
        order = 0
        waiting: deque[int] = deque()
        running = 0
        nxt = 0
        done = 0
        cache = self.cache
        mover = self.mover
        clock = self.clock
        max_running = self.model.max_running

        async def try_start(now: float) -> None:
            nonlocal running, order
            while waiting and running < max_running:
                i = waiting.popleft()
                running += 1
                run = runs[i]
                await self._start(run, now)
                if run.prefill_end <= now:
                    await self._prefill_done(run)
                    if run.finish <= now:
                        await finish(i, now)
                        continue
                    heapq.heappush(events, (run.finish, order, 1, i))
                else:
                    heapq.heappush(events, (run.prefill_end, order, 0, i))
                order += 1

        async def finish(i: int, now: float) -> None:
            nonlocal running, order, done
            held = await self._finish(runs[i], i, now)
            await mover.run_until(now)
            running -= 1
            done += 1
            if held > 0:
                heapq.heappush(events, (now + held, order, 2, i))
                order += 1

        n = len(reqs)
        while nxt < n or events or waiting:
            t_arr = runs[nxt].arrival if nxt < n else math.inf
            if events and events[0][0] <= t_arr:
                now, _, kind, i = heapq.heappop(events)
                clock.t = max(clock.t, now)
                now = clock.t
                await mover.run_until(now)
                cache.expire(now)
                if kind == 0:
                    await self._prefill_done(runs[i])
                    heapq.heappush(events, (runs[i].finish, order, 1, i))
                    order += 1
                elif kind == 1:
                    await finish(i, now)
            elif nxt < n:
                now = max(clock.t, t_arr)
                clock.t = now
                await mover.run_until(now)
                cache.expire(now)
                waiting.append(nxt)
                nxt += 1
                if progress is not None and (nxt & 255) == 0:
                    progress(256)
            else:  # waiting with nothing running: cannot happen (a lone request runs)
                raise RuntimeError("served replay: requests wait with none running")
            await try_start(clock.t)
        if progress is not None:
            progress(n & 255)
        await mover.run_pending()
        return self.result(time.perf_counter() - started)

    def result(self, elapsed_s: float) -> ServedResult:
        lk = max(self.lookups, 1)
        hits = sum(self.hits.values())
        scale = self.cost.block_bytes  # a stand-in block is one byte
        moved = {f"{s}->{d}": b * scale
                 for (s, d), b in sorted(self.engine.stats.moved_bytes.items())}
        loaded = sum(self.hits[t] for t in SIDECAR_TIERS) * scale
        moved["sidecar->engine"] = loaded
        tiers = {b.name: b.blocks for b in self.config.sidecar if b.blocks > 0}
        at = self.ttft_after_tool
        return ServedResult(
            policy=self.policy, engine_blocks=self.config.engine_blocks, tiers=tiers,
            hold_budget_blocks=self.config.hold_budget_blocks, requests=len(self.ttft),
            lookups=self.lookups, hit_blocks=hits, hit_rate=hits / lk,
            hits_by_tier={t: self.hits[t] / lk for t in ("engine", *SIDECAR_TIERS)},
            prefill_s_saved=self.saved_s, prefill_s_total=self.total_s,
            ttft_p50_s=_percentile(self.ttft, 0.5), ttft_p99_s=_percentile(self.ttft, 0.99),
            after_tool_ttft_p50_s=_percentile(at, 0.5),
            after_tool_ttft_p99_s=_percentile(at, 0.99), after_tool_requests=len(at),
            bytes_moved=moved, decode_blocks_saved=self.decode_saved,
            holds_made=self.cache.holds_made, holds_refused=self.cache.holds_refused,
            elapsed_s=elapsed_s)


async def replay_served(requests: Sequence[Request], policy: str, config: ServedConfig,
                        cost: CostModel, progress: Callable[[int], None] | None = None,
                        options: Mapping[str, Any] | None = None) -> ServedResult:
    """``requests`` through the served topology with ``policy`` (constructed with
    ``options``) behind the engine."""
    return await ServedReplay(requests, policy, config, cost, options).run(progress)
