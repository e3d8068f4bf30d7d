"""The redis tier: blocks in one Redis or a Redis Cluster, shared by sidecars on many hosts.

* **Layout** (:mod:`kvstore.tiers.redisformat`): per block a header key and the
  payload in chunks of at most ``chunk_bytes``, all under one hash tag (one
  Cluster slot), keyed by (namespace, block hash). Every read checks the whole
  payload against the header's xxh3-64: a value that does not match is a miss,
  is deleted and is counted (``corrupt``), and is never returned.
* **Batches** (:mod:`kvstore.tiers.rediscmds`): ``put_many`` / ``get_many`` /
  ``delete_many`` are one pipeline each (a Cluster pipeline sends to every node at
  once); a single read is one MGET of header and chunks; a block of more chunks
  than expected costs one more round trip.
* **TTL**: every write sets one (``ttl_seconds``, or ``ttl_for(meta)`` when the
  engine installs that hook, e.g. from the policy); with ``refresh_ttl_on_read``
  a read renews it once less than half of it is left (so a block in use stays,
  without turning every read into a write that replicas must follow);
  :meth:`RedisTier.set_ttl` changes it later.
* **Capacity** (:mod:`kvstore.tiers.redisledger`): ``capacity_bytes`` is this
  sidecar's budget in the shared store, ``used_bytes`` the payload bytes of the
  blocks it wrote or adopted (:meth:`adopt`) and has not seen deleted, missing or
  expired. Redis's own ``maxmemory`` bounds the store as a whole.
* **Failing open** (:mod:`kvstore.tiers.redisconn`): every call has a deadline;
  Redis down, slow, failing over, or a Cluster slot without a master is a miss
  for reads (``BlockNotFound``, ``contains`` False, ``probe`` empty) and
  ``TierUnavailable`` for writes (the engine skips that copy); ``maxmemory``
  refusals are ``TierUnavailable`` too. Each outcome is counted
  (:meth:`counters`); after a failure Redis is skipped for ``retry_interval``
  seconds, then the client reconnects by itself.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import xxhash

from kvstore.errors import BlockNotFound, DataCorruption, KVStoreError, TierUnavailable
from kvstore.tiers._common import as_bytes_view, check_put, tier_full
from kvstore.tiers.base import RemoteBlock, Tier
from kvstore.tiers.rediscmds import Commands, Write
from kvstore.tiers.redisconfig import RedisConfig
from kvstore.tiers.redisconn import Down, Link, make_client
from kvstore.tiers.redisformat import BadValue, Header, KeyNames, chunk_count, decode_header
from kvstore.tiers.redisledger import Ledger
from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["RedisTier"]

_HINTS = 4096


class RedisTier(Tier):
    """Tier, :class:`~kvstore.tiers.base.SharedTier` and
    :class:`~kvstore.tiers.base.CountingTier` over Redis (``cfg.url``) or a Redis
    Cluster (``cfg.cluster_nodes``). ``cfg.enabled`` is not consulted."""

    medium = Medium.REMOTE

    def __init__(self, cfg: RedisConfig, name: str = "redis", *,
                 clock: Callable[[], float] = time.monotonic,
                 client_factory: Callable[[RedisConfig], Any] = make_client) -> None:
        if cfg.capacity <= 0:
            raise ValueError(f"capacity must be positive, got {cfg.capacity}")
        self.name = name
        self.cfg = cfg
        self._clock = clock
        self._link = Link(cfg, name, clock=clock, factory=client_factory)
        self._keys = KeyNames(cfg.key_prefix)
        self._cmds = Commands(self._keys, cfg.chunk_bytes)
        self._ledger = Ledger()
        self._inflight = 0
        self._chunks_seen: OrderedDict[BlockKey, int] = OrderedDict()
        self._counters: Counter[str] = Counter()
        #: Per-block TTL in seconds (``None``: the configured default; <= 0: none).
        self.ttl_for: Callable[[BlockMeta], float | None] | None = None

    # ---- Tier -------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        return self.cfg.capacity

    @property
    def used_bytes(self) -> int:
        """Payload bytes of the blocks this sidecar holds in Redis, plus writes in flight."""
        return self._ledger.used + self._inflight

    def can_fit(self, size: int) -> bool:
        return 0 < size <= self.cfg.capacity - self.used_bytes

    async def put(self, meta: BlockMeta, payload: bytes | memoryview) -> None:
        await self.put_many([(meta, payload)])

    async def put_many(self, items: Sequence[tuple[BlockMeta, bytes | memoryview]]) -> None:
        writes: list[Write] = []
        grow = 0
        refused = None
        for meta, payload in items:
            view = as_bytes_view(payload)
            size = check_put(self.name, self.cfg.capacity, meta, view)
            checksum = xxhash.xxh3_64_intdigest(view)
            if meta.checksum and checksum != meta.checksum:
                raise DataCorruption(
                    f"block {meta.key} was not written to tier {self.name!r}: its payload does "
                    "not match its checksum (the source changed or was corrupted)")
            held = self._ledger.get(meta.key)
            freed = held.size if held is not None else 0
            if self.used_bytes + grow - freed + size > self.cfg.capacity:
                refused = tier_full(self.name, size, self.used_bytes + grow, self.cfg.capacity,
                                    "this sidecar's budget in the shared store")
                break
            grow += size - freed
            writes.append(Write(meta, view, checksum, self._ttl(meta),
                                 held.chunks if held is not None else 0))
        if writes:
            await self._write(writes, max(grow, 0))
        if refused is not None:
            raise refused

    async def get(self, key: BlockKey) -> bytes | memoryview:
        return (await self.get_many([key]))[0]

    async def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | memoryview]:
        """Payloads, verified; raises the first block's error (BlockNotFound for a miss or
        an outage, DataCorruption for a value that failed its checks and was deleted)."""
        if not keys:
            return []
        try:
            first = await self._link.run("read", lambda c: self._cmds.read(
                c, [(k, 0, self._chunks_hint(k), True) for k in keys]))
            headers = [self._header(k, vals[0]) for k, vals in zip(keys, first, strict=True)]
            parts = [vals[1:] for vals in first]
            more = [i for i, h in enumerate(headers)
                    if isinstance(h, Header) and h.chunks > len(parts[i])]
            if more:
                extra = await self._link.run("read", lambda c: self._cmds.read(
                    c, [(keys[i], len(parts[i]), headers[i].chunks, False)  # type: ignore[union-attr]
                        for i in more]))
                for i, vals in zip(more, extra, strict=True):
                    parts[i] = parts[i] + vals
        except Down as exc:
            self._count(exc)
            self._counters["misses"] += len(keys)
            raise BlockNotFound(
                f"block {keys[0]}: tier {self.name!r} unreachable ({exc}); a miss") from exc
        out: list[bytes | memoryview] = []
        error: KVStoreError | None = None
        bad: list[tuple[BlockKey, int]] = []
        for key, header, chunks in zip(keys, headers, parts, strict=True):
            got = header if isinstance(header, KVStoreError) else self._payload(key, header,
                                                                               chunks)
            if isinstance(got, KVStoreError):
                error = error or got
                if not isinstance(got, BlockNotFound) or isinstance(header, Header):
                    bad.append((key, max(len(chunks), 1)))
                continue
            out.append(got)
        if bad:
            await self._unlink_quietly(bad)
        if self.cfg.refresh_ttl_on_read:
            await self._renew_due(keys)
        if error is not None:
            raise error
        return out

    async def contains(self, key: BlockKey) -> bool:
        try:
            n = await self._link.run("exists", lambda c: c.exists(self._keys.header(key)))
        except Down as exc:
            self._count(exc)
            return False
        return bool(n)

    async def delete(self, key: BlockKey) -> bool:
        return await self.delete_many([key]) > 0

    async def delete_many(self, keys: Sequence[BlockKey]) -> int:
        if not keys:
            return 0
        chunks: dict[BlockKey, int] = {}
        for key in keys:
            held = self._ledger.pop(key)
            if held is not None:
                chunks[key] = held.chunks
            elif key in self._chunks_seen:
                chunks[key] = self._chunks_seen[key]
        try:
            unknown = [k for k in keys if k not in chunks]
            if unknown:  # not ours: read its header to learn how many chunks it has
                heads = await self._link.run("read", lambda c: self._cmds.read(
                    c, [(k, 0, 0, True) for k in unknown]))
                for key, vals in zip(unknown, heads, strict=True):
                    header = self._header(key, vals[0], count=False)
                    chunks[key] = header.chunks if isinstance(header, Header) else 1
            return await self._link.run("delete", lambda c: self._cmds.unlink(
                c, [(k, chunks[k]) for k in keys]))
        except Down as exc:
            self._count(exc)
            return 0

    async def close(self) -> None:
        await self._link.close()
        self._ledger.clear()

    # ---- SharedTier / CountingTier -----------------------------------------------
    async def probe(self, namespace: str, hashes: Sequence[bytes]) -> list[RemoteBlock]:
        keys = [BlockKey(namespace, h) for h in hashes[:self.cfg.probe_max_blocks]]
        if not keys:
            return []
        self._counters["probes"] += 1
        try:
            res = await self._link.run("probe", lambda c: self._cmds.probe(c, keys),
                                       self.cfg.probe_timeout)
        except Down as exc:
            self._count(exc)
            return []
        found: list[RemoteBlock] = []
        for key, (raw, pttl) in zip(keys, res, strict=True):
            header = self._header(key, raw, count=False)
            if not isinstance(header, Header):
                if isinstance(header, DataCorruption):
                    await self._unlink_quietly([(key, 1)])
                break
            self._remember_chunks(key, header.chunks)
            ttl = pttl / 1000.0 if isinstance(pttl, int) and pttl > 0 else None
            found.append(RemoteBlock(header.meta, ttl))
        self._counters["probe_hits"] += len(found)
        return found

    def adopt(self, block: RemoteBlock) -> None:
        key = block.meta.key
        chunks = self._chunks_seen.get(key) or chunk_count(block.meta.size, self.cfg.chunk_bytes)
        self._ledger.set(key, block.meta.size, chunks, self._deadline(block.ttl_s),
                         self.cfg.ttl_seconds if block.ttl_s is not None else 0.0)
        self._counters["adopted"] += 1

    def expired(self) -> list[BlockKey]:
        keys = self._ledger.expired(self._clock())
        self._counters["expired"] += len(keys)
        return keys

    def counters(self) -> Mapping[str, int]:
        return dict(self._counters)

    async def set_ttl(self, keys: Sequence[BlockKey], seconds: float) -> int:
        """Give stored blocks a new TTL (``<= 0``: none); the number of blocks found."""
        plan = [(k, self._chunks_hint(k), seconds) for k in keys]
        try:
            found = await self._link.run("expire", lambda c: self._cmds.expire(c, plan))
        except Down as exc:
            self._count(exc)
            return 0
        for key, _, _ in plan:
            self._ledger.renew(key, self._deadline(seconds), seconds)
        return found

    # ---- internals ----------------------------------------------------------------
    def _ttl(self, meta: BlockMeta) -> float:
        ttl = self.ttl_for(meta) if self.ttl_for is not None else None
        return self.cfg.ttl_seconds if ttl is None else ttl

    def _deadline(self, ttl: float | None) -> float:
        return self._clock() + ttl if ttl is not None and ttl > 0 else math.inf

    def _chunks_hint(self, key: BlockKey) -> int:
        held = self._ledger.get(key)
        if held is not None:
            return held.chunks
        return self._chunks_seen.get(key, 1)

    def _remember_chunks(self, key: BlockKey, n: int) -> None:
        self._chunks_seen[key] = n
        self._chunks_seen.move_to_end(key)
        if len(self._chunks_seen) > _HINTS:
            self._chunks_seen.popitem(last=False)

    def _count(self, exc: Down) -> None:
        self._counters[exc.kind] += 1

    def _header(self, key: BlockKey, raw: Any, count: bool = True) -> Header | KVStoreError:
        if raw is None:
            self._ledger.pop(key)
            if count:
                self._counters["misses"] += 1
            return BlockNotFound(f"block {key} is not in tier {self.name!r}")
        try:
            if not isinstance(raw, bytes):
                raise BadValue(f"not a string value ({type(raw).__name__}: {raw})")
            header = decode_header(raw)
        except BadValue as exc:
            self._ledger.pop(key)
            self._counters["corrupt"] += 1
            return DataCorruption(f"block {key} in tier {self.name!r} has a bad header ({exc}); "
                                  "it was deleted")
        if header.meta.key != key:  # another namespace whose tag collides: not ours to see
            if count:
                self._counters["misses"] += 1
            return BlockNotFound(f"block {key} is not in tier {self.name!r}")
        return header

    def _payload(self, key: BlockKey, header: Header, chunks: list[Any]
                 ) -> bytes | KVStoreError:
        meta = header.meta
        if len(chunks) < header.chunks or any(not isinstance(c, bytes)
                                              for c in chunks[:header.chunks]):
            self._ledger.pop(key)
            self._counters["torn"] += 1
            self._counters["misses"] += 1
            return BlockNotFound(f"block {key} is incomplete in tier {self.name!r} (a chunk "
                                 "expired, was evicted, or is being replaced); a miss")
        payload = chunks[0] if header.chunks == 1 else b"".join(chunks[:header.chunks])
        if len(payload) != meta.size or xxhash.xxh3_64_intdigest(payload) != meta.checksum:
            self._ledger.pop(key)
            self._counters["corrupt"] += 1
            return DataCorruption(f"block {key} in tier {self.name!r} failed its checksum; "
                                  "it was deleted, not served")
        self._counters["hits"] += 1
        self._counters["bytes_read"] += meta.size
        return bytes(payload)

    async def _write(self, writes: list[Write], grow: int) -> None:
        self._inflight += grow
        try:
            errors = await self._link.run("write", lambda c: self._cmds.write(c, writes))
        except Down as exc:
            self._count(exc)
            if exc.kind != "skipped":
                await self._unlink_quietly([(w.meta.key, 1) for w in writes])
            raise TierUnavailable(
                f"tier {self.name!r}: {len(writes)} blocks not written: {exc}") from exc
        finally:
            self._inflight -= grow
        failed = [(w, e) for w, e in zip(writes, errors, strict=True) if e is not None]
        for w, e in zip(writes, errors, strict=True):
            if e is None:
                n = chunk_count(w.meta.size, self.cfg.chunk_bytes)
                self._ledger.set(w.meta.key, w.meta.size, n, self._deadline(w.ttl), w.ttl)
                self._counters["puts"] += 1
                self._counters["bytes_written"] += w.meta.size
        if failed:
            from redis.exceptions import OutOfMemoryError

            oom = any(isinstance(e, OutOfMemoryError) for _, e in failed)
            self._counters["oom" if oom else "unavailable"] += 1
            await self._unlink_quietly([(w.meta.key, 1) for w, _ in failed])
            for w, _ in failed:
                self._ledger.pop(w.meta.key)
            why = "redis is at maxmemory" if oom else f"redis refused: {failed[0][1]}"
            raise TierUnavailable(
                f"tier {self.name!r}: {len(failed)} of {len(writes)} blocks not written ({why})")

    async def _renew_due(self, keys: Sequence[BlockKey]) -> None:
        """Renew the TTL of the blocks read whose TTL is more than half gone."""
        now = self._clock()
        due = []
        for key in keys:
            held = self._ledger.get(key)
            if held is not None and held.ttl > 0 and held.deadline - now < held.ttl / 2:
                due.append((key, held.chunks, held.ttl))
        if not due:
            return
        try:
            await self._link.run("expire", lambda c: self._cmds.expire(c, due))
        except Down as exc:
            self._count(exc)
            return
        for key, _, ttl in due:
            self._ledger.renew(key, now + ttl)
        self._counters["renewed"] += len(due)

    async def _unlink_quietly(self, plan: list[tuple[BlockKey, int]]) -> None:
        """Best effort (the value is unusable anyway; its TTL removes it otherwise)."""
        try:
            await self._link.run("delete", lambda c: self._cmds.unlink(c, plan))
        except Down as exc:
            self._count(exc)
