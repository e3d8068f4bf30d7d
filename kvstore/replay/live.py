"""Live replay: the same requests, played against a running ``kvstore serve``.

:class:`ClientStore` is the driver's :class:`~kvstore.replay.driver.Store` over
the async client, so a live replay makes exactly the calls the offline one
makes to the engine (lookup with a request id, puts of what the lookup said to
offer, the turn hint), now over gRPC and shared memory, with payloads of
``payload_bytes`` derived from each block's hash. Requests start at their
trace times compressed ``speedup`` times, one after the other; the server's
mover runs on its own clock. The table is the offline one, with the server's
tiers as it reports them (blocks = capacity / payload size).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from kvstore.client import AsyncKVStoreClient
from kvstore.errors import KVStoreError
from kvstore.policies.cost import CostModel
from kvstore.replay.driver import NAMESPACE, Replayer, ReplayResult, TierBudget
from kvstore.replay.trace import Request
from kvstore.types import BlockData, Medium

__all__ = ["ClientStore", "payload_for", "replay_live"]


def payload_for(block_hash: bytes, size: int) -> bytes:
    """The bytes a replayed block carries (a function of its hash, so any reader can
    tell them apart)."""
    return (block_hash * (size // len(block_hash) + 1))[:size]


class ClientStore:
    """The replay's store over a server, through the async client."""

    def __init__(self, client: AsyncKVStoreClient, payload_bytes: int, block_tokens: int,
                 speedup: float) -> None:
        self.client = client
        self.payload_bytes = payload_bytes
        self.block_tokens = block_tokens
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

    async def lookup(self, req: Request, hashes: list[bytes], request_id: str
                     ) -> tuple[list[Medium], int]:
        await self._pace(req)
        res = await self.client.lookup(NAMESPACE, hashes, req.session_id or "",
                                       req.workload or "", request_id=request_id,
                                       num_tokens=req.input_length)
        return list(res.media), res.store_blocks

    async def put(self, req: Request, hashes: list[bytes], start: int, stop: int,
                  request_id: str) -> None:
        if start >= stop:
            return
        tokens = self.block_tokens
        last = len(hashes) - 1
        tail = max(1, req.input_length - last * tokens)
        blocks = [BlockData(hashes[j], hashes[j - 1] if j else None,
                            range(tail if j == last else tokens),
                            payload_for(hashes[j], self.payload_bytes))
                  for j in range(start, stop)]
        try:
            await self.client.put(NAMESPACE, blocks, req.session_id or None,
                                  req.workload or None, request_id=request_id)
        except KVStoreError:
            self.errors += 1  # a refused save (no room now): the next turn recomputes

    async def hint(self, req: Request, event: str, request_id: str) -> None:
        after = req.after
        await self.client.hint(req.session_id or "", event, req.workload or None,
                               after.tool if after else None, namespace=NAMESPACE,
                               request_id=request_id)

    async def retain(self, req: Request, hashes: list[bytes]) -> None:
        try:
            await self.client.retain(NAMESPACE, hashes, req.cache_ttl_s or 0.0)
        except KVStoreError:
            self.errors += 1

    async def settle(self) -> None:
        return None  # the server's mover runs on its own


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
        store = ClientStore(client, payload_bytes, cost.block_tokens, speedup)
        name = f"{stats.policy or 'server'} (live)"
        replayer = Replayer(store, name, budgets, cost)
        result = await replayer.run(requests, progress)
        return result
