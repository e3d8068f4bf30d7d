"""Live replay: the same requests, played against a running ``kvstore serve``.

:class:`ClientSidecar` is a served node's sidecar (:class:`~kvstore.replay.node.Sidecar`)
over the async client, so a live replay plays each request through the offline
replay's own per-request path (:class:`~kvstore.replay.node.ServedNode`, the
sidecar alone: :func:`~kvstore.replay.served.sidecar_alone`) and makes exactly the
calls it makes to the engine (lookup of the full blocks with a request id, puts of
what the lookup said to offer, the retention, the turn hint), now over gRPC and
shared memory, with payloads of ``payload_bytes`` derived from each block's hash.
Requests start at their trace times compressed ``speedup`` times, one after the
other; the server's mover runs on its own clock. The table is the offline one, with
the server's tiers as it reports them (blocks = capacity / payload size).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from kvstore.client import AsyncKVStoreClient
from kvstore.engine.blocks import NewBlock
from kvstore.errors import KVStoreError
from kvstore.policies import Hint
from kvstore.policies.cost import CostModel
from kvstore.replay.driver import NAMESPACE, ReplayResult, TierBudget, VirtualClock
from kvstore.replay.node import Run, ServedNode
from kvstore.replay.served import play
from kvstore.replay.served_config import sidecar_alone
from kvstore.replay.trace import Request
from kvstore.types import BlockData, Medium

__all__ = ["ClientSidecar", "payload_for", "replay_live"]


def payload_for(block_hash: bytes, size: int) -> bytes:
    """The bytes a replayed block carries (a function of its hash, so any reader can
    tell them apart)."""
    return (block_hash * (size // len(block_hash) + 1))[:size]


class ClientSidecar:
    """A served node's sidecar over a server, through the async client."""

    def __init__(self, client: AsyncKVStoreClient, payload_bytes: int, speedup: float) -> None:
        self.client = client
        self.payload_bytes = payload_bytes
        self.speedup = speedup
        self._t0: float | None = None
        self._wall0 = 0.0
        self.late_s = 0.0
        self.errors = 0

    async def _pace(self, req: Request) -> None:
        t = req.timestamp_ms / 1000.0
        if self._t0 is None:
            self._t0, self._wall0 = t, time.monotonic()
        due = self._wall0 + (t - self._t0) / self.speedup
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        else:
            self.late_s = max(self.late_s, -wait)

    async def lookup(self, run: Run, then: str, tool: str, engine_hit_tokens: int
                     ) -> tuple[Sequence[Medium], int, float]:
        req = run.req
        await self._pace(req)
        res = await self.client.lookup(NAMESPACE, run.hashes, req.session_id or "",
                                       req.workload or "", request_id=run.rid,
                                       num_tokens=req.input_length, then=then or None,
                                       tool=tool or None)
        return res.media, res.store_blocks, res.keep_ms / 1000.0

    async def save(self, run: Run, blocks: list[NewBlock]) -> None:
        req = run.req
        data = [BlockData(b.block_hash, b.parent_hash, range(b.num_tokens),
                          payload_for(b.block_hash, self.payload_bytes)) for b in blocks]
        try:
            await self.client.put(NAMESPACE, data, req.session_id or None,
                                  req.workload or None, request_id=run.rid)
        except KVStoreError:
            self.errors += 1  # a refused save (no room now): the next turn recomputes

    async def retain(self, run: Run, hashes: list[bytes], ttl_s: float) -> None:
        try:
            await self.client.retain(NAMESPACE, hashes, ttl_s)
        except KVStoreError:
            self.errors += 1

    async def hint(self, run: Run, hint: Hint) -> None:
        await self.client.hint(run.req.session_id or "", hint.event, run.req.workload or None,
                               hint.tool, namespace=NAMESPACE, request_id=run.rid)

    async def run_until(self, now: float) -> None:
        return None  # the server's mover runs on its own

    async def run_pending(self) -> None:
        return None

    def moved_bytes(self) -> dict[tuple[str, str], int]:
        return {}


async def replay_live(requests: Sequence[Request], address: str, cost: CostModel,
                      payload_bytes: int = 64 << 10, speedup: float = 1.0,
                      progress: Callable[[int], None] | None = None) -> ReplayResult:
    """Play ``requests`` against the server at ``address``; the result names the
    server's policy and tiers."""
    if payload_bytes <= 0:
        raise ValueError(f"payload_bytes must be > 0, got {payload_bytes}")
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    async with AsyncKVStoreClient(address) as client:
        stats = await client.stats()
        budgets = [TierBudget(t.name, t.capacity_bytes // payload_bytes) for t in stats.tiers]
        tiers = [b.name for b in budgets if b.blocks > 0]
        name = f"{stats.policy or 'server'} (live)"
        node = ServedNode(name, sidecar_alone(budgets), cost, None,
                          ClientSidecar(client, payload_bytes, speedup), VirtualClock(), tiers)
        started = time.perf_counter()
        await play(requests, [node], None, progress)
        elapsed = time.perf_counter() - started
    lk = max(node.lookups, 1)
    hits = sum(node.hits.values())
    return ReplayResult(
        policy=name, tiers={b.name: b.blocks for b in budgets if b.blocks > 0},
        requests=node.requests, lookups=node.lookups, hit_blocks=hits, hit_rate=hits / lk,
        hit_rate_by_tier={t: node.hits[t] / lk for t in tiers}, bytes_moved={},
        prefill_s_saved=node.saved_s, prefill_s_total=node.total_s, elapsed_s=elapsed)
