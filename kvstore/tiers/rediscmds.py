"""The redis tier's commands on the wire: one pipeline (or one MGET) per batch.

Each function takes the client (``redis.asyncio.Redis`` or ``RedisCluster``) and
returns plain results; deadlines, the breaker and what failures mean are the
caller's (:class:`~kvstore.tiers.redisconn.Link`, :class:`~kvstore.tiers.redis.RedisTier`).
Every command of a block names keys under the block's hash tag, so in a
Cluster they go to one node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvstore.tiers.redisconn import raise_transient
from kvstore.tiers.redisformat import KeyNames, chunk_count, encode_header
from kvstore.types import BlockKey, BlockMeta

__all__ = ["Commands", "Write"]


@dataclass(slots=True)
class Write:
    meta: BlockMeta
    view: memoryview
    checksum: int
    ttl: float
    old_chunks: int


def _px(ttl: float) -> int | None:
    return max(1, int(ttl * 1000)) if ttl > 0 else None


class Commands:
    def __init__(self, keys: KeyNames, chunk_bytes: int) -> None:
        self.keys = keys
        self.chunk_bytes = chunk_bytes

    async def write(self, client: Any, writes: list[Write]) -> list[Exception | None]:
        """Chunks then header per block (a reader that finds the header finds the chunks
        written before it); per block the first error, or None."""
        size = self.chunk_bytes
        pipe = client.pipeline(transaction=False)
        spans: list[int] = []
        for w in writes:
            base = self.keys.base(w.meta.key)
            n = chunk_count(w.meta.size, size)
            px = _px(w.ttl)
            for i in range(n):
                pipe.set(base + b"%d" % i, w.view[i * size:(i + 1) * size], px=px)
            extra = [base + b"%d" % i for i in range(n, w.old_chunks)]
            if extra:
                pipe.execute_command("UNLINK", *extra)
            pipe.set(base + b"h", encode_header(w.meta, w.checksum, size), px=px)
            spans.append(n + 1 + (1 if extra else 0))
        res = raise_transient(await pipe.execute(raise_on_error=False))
        out: list[Exception | None] = []
        i = 0
        for span in spans:
            errs = [r for r in res[i:i + span] if isinstance(r, Exception)]
            out.append(errs[0] if errs else None)
            i += span
        return out

    async def read(self, client: Any, reqs: list[tuple[BlockKey, int, int, bool]]
                   ) -> list[list[Any]]:
        """Per request (key, first chunk, end chunk, with header): [header?, chunks...];
        one MGET per block, pipelined when there are several."""
        argv = [([self.keys.header(key)] if with_header else [])
                + self.keys.chunks(key, stop, start) for key, start, stop, with_header in reqs]
        if len(argv) == 1:
            return [list(await client.execute_command("MGET", *argv[0]))]
        pipe = client.pipeline(transaction=False)
        for names in argv:
            pipe.execute_command("MGET", *names)
        res = raise_transient(await pipe.execute(raise_on_error=False))
        return [[r] * len(names) if isinstance(r, Exception) else list(r)
                for r, names in zip(res, argv, strict=True)]

    async def probe(self, client: Any, keys: list[BlockKey]) -> list[tuple[Any, Any]]:
        """(header value, PTTL in ms) per key."""
        pipe = client.pipeline(transaction=False)
        for key in keys:
            name = self.keys.header(key)
            pipe.get(name)
            pipe.pttl(name)
        res = raise_transient(await pipe.execute(raise_on_error=False))
        return list(zip(res[0::2], res[1::2], strict=True))

    async def expire(self, client: Any, plan: list[tuple[BlockKey, int, float]]) -> int:
        """Set each block's TTL (``<= 0``: none) on its header and chunks; the number of
        blocks whose header was there."""
        pipe = client.pipeline(transaction=False)
        for key, n, ttl in plan:
            for name in [self.keys.header(key), *self.keys.chunks(key, n)]:
                if ttl > 0:
                    pipe.pexpire(name, _px(ttl))
                else:
                    pipe.persist(name)
        res = await pipe.execute(raise_on_error=False)
        found = 0
        i = 0
        for _, n, _ in plan:
            found += res[i] is True or res[i] == 1
            i += n + 1
        return found

    async def unlink(self, client: Any, plan: list[tuple[BlockKey, int]]) -> int:
        """Remove blocks (header and ``n`` chunks each); the number whose header was there."""
        pipe = client.pipeline(transaction=False)
        for key, n in plan:
            pipe.execute_command("UNLINK", self.keys.header(key))
            pipe.execute_command("UNLINK", *self.keys.chunks(key, n))
        res = await pipe.execute(raise_on_error=False)
        return sum(1 for r in res[0::2] if r == 1)
