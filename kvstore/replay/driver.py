"""The untimed request loop of the live and fleet replays, and the replay's names.

The offline replay (``kvstore replay``, the profile's curves, the grid) runs the
served topology (:mod:`kvstore.replay.served`); this loop is what the live replay
(:mod:`kvstore.replay.live`, against a running server) and the fleet replay
(:mod:`kvstore.replay.fleet`, one :class:`EngineStore` per worker) still run.
Each request is played, one at a time and taking no time, against a
:class:`Store`: look the request up (with its session, workload, a request id and
its prompt length), let background transfers run (the prefetch of a returning
session's prefix), store the blocks after the served prefix that the lookup said
to offer (the engine admits them where the policy's plan says, and counts the
ones it already holds), then send the hint its ``after`` field carries
(``tool_call``, ``turn_end`` for a user turn, ``session_end``) and let transfers
run again. The next request's time is never shown to anyone.

The fleet's store (:class:`EngineStore`) is the server's own
:class:`~kvstore.engine.core.Engine` with in-memory tiers, a virtual clock and
the mover's queue run between requests: the same index, placement, write-back,
prefetch, admission, sessions and events as ``kvstore serve``. Blocks are
one-byte stand-ins, so capacities are in blocks; the cost model prices them at
the trace's geometry (512 tokens, ``CostModel.block_bytes``). The live store
(:mod:`kvstore.replay.live`) sends the same calls to a running server.
"""

from __future__ import annotations

import contextlib
import time
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
from kvstore.replay.trace import Request
from kvstore.tiers.memory import MemoryTier
from kvstore.turns import AFTER_EVENTS
from kvstore.types import Medium

__all__ = ["MEDIA", "NAMESPACE", "EngineStore", "ReplayResult", "Replayer", "Store",
           "TierBudget", "VirtualClock", "block_hash", "build_engine"]

#: Namespace of replayed blocks.
NAMESPACE = "trace"
#: Medium of each replay tier name (events, and which tier served a hit); ``hbm`` is
#: the fleet replay's policy-managed GPU tier only (the served replay's GPU is the
#: engine's own cache, not a tier).
MEDIA: dict[str, Medium] = {"hbm": Medium.GPU, "dram": Medium.CPU, "disk": Medium.DISK,
                            "redis": Medium.REMOTE}


def block_hash(block_id: int) -> bytes:
    """A trace block id as an 8-byte hash (its int64 form on the wire is the id)."""
    return block_id.to_bytes(8, "big")


@dataclass(frozen=True, slots=True)
class TierBudget:
    name: str
    blocks: int


class VirtualClock:
    """The replay's time: the timestamp of the request being played."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Store(Protocol):
    """What the replay needs from a kvstore: the engine itself, or a server."""

    async def lookup(self, req: Request, hashes: list[bytes], request_id: str
                     ) -> tuple[list[Medium], int]:
        """(media of the served prefix, blocks after it to offer for storing)."""
        ...

    async def put(self, req: Request, hashes: list[bytes], start: int, stop: int,
                  request_id: str) -> None:
        """Store blocks ``start:stop`` of the request."""
        ...

    async def hint(self, req: Request, event: str, request_id: str) -> None: ...

    async def retain(self, req: Request, hashes: list[bytes]) -> None:
        """Retain ``hashes`` for the request's ``cache_ttl_s``."""
        ...

    async def settle(self) -> None:
        """Let background transfers run (offline: the mover's queue, now)."""
        ...


def build_engine(policy: str, budgets: Sequence[TierBudget], cost: CostModel,
                 clock: Callable[[], float], events: EventSink | None = None,
                 write_back: bool = True, options: Mapping[str, Any] | None = None
                 ) -> Engine:
    """The server's engine over in-memory tiers of ``budgets`` blocks each;
    ``options`` go to the policy's constructor."""
    tiers = [MemoryTier(b.blocks, name=b.name, medium=MEDIA.get(b.name, Medium.CPU))
             for b in budgets if b.blocks > 0]
    if not tiers:
        raise ValueError("every tier has 0 blocks; give --hbm-blocks N")
    pol = policies.create(policy, tier_specs(tiers), cost=cost, **(options or {}))
    engine = Engine(tiers, pol, events, clock=clock, cost=cost, write_back=write_back,
                    max_hashes=1 << 30, max_block_bytes=1 << 30)
    engine.set_geometry(NAMESPACE, cost.block_bytes, cost.block_tokens, stored_bytes=1)
    return engine


class EngineStore:
    """The engine in this process (what ``kvstore serve`` runs), driven directly."""

    def __init__(self, engine: Engine, clock: VirtualClock) -> None:
        self.engine = engine
        self.clock = clock
        self._payload = b"\0"

    async def lookup(self, req: Request, hashes: list[bytes], request_id: str
                     ) -> tuple[list[Medium], int]:
        self.clock.t = req.timestamp_ms / 1000.0
        found = await self.engine.serve_lookup(NAMESPACE, hashes, req.session_id or "",
                                               req.workload or "", request_id=request_id,
                                               num_tokens=req.input_length)
        return found.media, found.store

    async def put(self, req: Request, hashes: list[bytes], start: int, stop: int,
                  request_id: str) -> None:
        if start >= stop:
            return
        tokens = self.engine.geometry.of(NAMESPACE)[1]
        last = len(hashes) - 1
        tail = max(1, req.input_length - last * tokens)
        payload = self._payload
        blocks = [NewBlock(hashes[j], hashes[j - 1] if j else None, (), payload,
                           tail if j == last else tokens) for j in range(start, stop)]
        with contextlib.suppress(TierFull):  # no room at all: a skipped save, as vLLM's
            await self.engine.put(NAMESPACE, blocks, req.session_id or "",
                                  req.workload or "", request_id=request_id)

    async def hint(self, req: Request, event: str, request_id: str) -> None:
        after = req.after
        self.engine.hint(Hint(req.session_id or "", event, req.workload or "unknown",
                              after.tool if after else None), NAMESPACE, request_id)

    async def retain(self, req: Request, hashes: list[bytes]) -> None:
        self.engine.retain(NAMESPACE, hashes, req.cache_ttl_s or 0.0)

    async def settle(self) -> None:
        await self.engine.mover.run_pending()


@dataclass(frozen=True, slots=True)
class ReplayResult:
    policy: str
    tiers: dict[str, int]
    requests: int
    lookups: int
    hit_blocks: int
    hit_rate: float
    hit_rate_by_tier: dict[str, float]
    bytes_moved: dict[str, int]
    prefill_s_saved: float
    prefill_s_total: float
    elapsed_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy, "tiers": self.tiers, "requests": self.requests,
            "lookups": self.lookups, "hit_blocks": self.hit_blocks, "hit_rate": self.hit_rate,
            "hit_rate_by_tier": self.hit_rate_by_tier, "bytes_moved": self.bytes_moved,
            "prefill_s_saved": self.prefill_s_saved, "prefill_s_total": self.prefill_s_total,
            "elapsed_s": self.elapsed_s,
        }


class Replayer:
    """Plays requests against a store and keeps the score."""

    def __init__(self, store: Store, name: str, budgets: Sequence[TierBudget],
                 cost: CostModel) -> None:
        self.store = store
        self.name = name
        self.budgets = tuple(b for b in budgets if b.blocks > 0)
        self.cost = cost
        self._tier_of = {MEDIA.get(b.name, Medium.CPU): i for i, b in enumerate(self.budgets)}
        self._saved = [cost.saved_s(TierSpec(b.name, 0, read_bytes_per_s(b.name)))
                       for b in self.budgets]
        self._block_s = cost.recompute_s(cost.block_tokens)
        self.hits_by_tier = [0] * len(self.budgets)
        self.lookups = 0
        self.requests = 0
        self.saved_s = 0.0
        self.total_s = 0.0
        self._n = 0

    async def play(self, req: Request) -> int:
        """Replay one request; returns its prefix-hit blocks."""
        rid = f"r{self._n}"
        self._n += 1
        hashes = [block_hash(h) for h in req.hash_ids]
        media, store = await self.store.lookup(req, hashes, rid)
        served = len(media)
        for m in media:
            t = self._tier_of[m]
            self.hits_by_tier[t] += 1
            self.saved_s += self._saved[t]
        self.lookups += len(hashes)
        self.requests += 1
        self.total_s += len(hashes) * self._block_s
        await self.store.settle()
        await self.store.put(req, hashes, served, served + store, rid)
        if req.cache_ttl_s:
            n = len(hashes) if req.cache_blocks is None else min(req.cache_blocks, len(hashes))
            await self.store.retain(req, hashes[:n])
        if req.after is not None:
            await self.store.hint(req, AFTER_EVENTS[req.after.kind], rid)
        await self.store.settle()
        return served

    async def run(self, requests: Sequence[Request],
                  progress: Callable[[int], None] | None = None) -> ReplayResult:
        start = time.perf_counter()
        for i, req in enumerate(requests):
            await self.play(req)
            if progress is not None and (i & 255) == 255:
                progress(256)
        if progress is not None:
            progress(len(requests) & 255)
        return self.result(time.perf_counter() - start)

    def result(self, elapsed_s: float = 0.0, moved: dict[str, int] | None = None
               ) -> ReplayResult:
        hits = sum(self.hits_by_tier)
        lk = max(self.lookups, 1)
        return ReplayResult(
            policy=self.name, tiers={b.name: b.blocks for b in self.budgets},
            requests=self.requests, lookups=self.lookups, hit_blocks=hits, hit_rate=hits / lk,
            hit_rate_by_tier={b.name: h / lk for b, h in zip(self.budgets, self.hits_by_tier,
                                                               strict=True)},
            bytes_moved=dict(sorted((moved or {}).items())), prefill_s_saved=self.saved_s,
            prefill_s_total=self.total_s, elapsed_s=elapsed_s)
