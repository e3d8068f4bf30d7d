"""``KVStoreRemoteConnector``: the LMCache ``RemoteConnector`` whose chunks live in the
kvstore sidecar. Imports LMCache (and so torch); loaded through :mod:`.adapter`.

What LMCache calls and what it gets:

* ``batched_contains`` / ``batched_async_contains`` / ``exists``: one ``Lookup`` per
  run of keys of one namespace; the length of the consecutive stored prefix. With
  ``zero_copy`` (and ``hold_ahead_s`` > 0) the same round trip takes the prefix's
  read lease, and the get that follows hands those slots over without another
  (:mod:`.ahead`).
* ``batched_put`` / ``put``: the chunk bytes as they are (``MemoryObj.byte_array``),
  written into the sidecar's shared memory when co-located, streamed over gRPC
  otherwise. No header: the namespace fingerprints the full chunk's layout and a
  partial chunk's token count follows from its size.
* ``batched_get``, when LMCache keeps no local CPU cache (``local_cpu: false``): no
  copy at all. Each chunk is a ``TensorMemoryObj`` over the sidecar's slot itself,
  checked against its checksum, held under one read lease that ends when LMCache
  frees the last of them (which it does once it has loaded them into the KV cache); the
  client renews that lease while LMCache holds any of them, so the slot under a memory
  object is never given to another block (:mod:`kvstore.client.held`).
* ``batched_get`` with a local CPU cache (LMCache keeps what it retrieved, for as
  long as it likes, which no lease covers), ``batched_get_non_blocking`` (prefetched
  objects wait for their request) and ``get`` (LMCache files a single get in its
  local cache whatever its config): each payload is copied once, from the slot
  (under its read lease) into a ``MemoryObj`` allocated from LMCache's own allocator
  for exactly that many tokens, and the copy is checked as it is made (one pass over
  the bytes: :mod:`.fused`) against the checksum the sidecar returned with the slot.
* ``remove_sync``: ``Delete``; ``list``: ``[]`` (the sidecar lists namespaces, not keys).

Fail open: every call goes through :class:`~.link.FailOpenLink` and is bounded by
``timeout_s``; the bytes move on the plugin's own threads, so LMCache's event loop is
never blocked. Memory objects a late thread still holds are released when it ends.
Ping is not offered: a ping error would make LMCache's health monitor stop all of
LMCache (its default fallback is to recompute), while the plugin already answers
misses for as long as the sidecar is away.

The get side (``batched_get``, ``get``, ``batched_get_non_blocking``: held slots and
checked copies) is :mod:`.reads`; contains, put and the rest are here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvstore.connectors.lmcache.ahead import HeldAhead
from kvstore.connectors.lmcache.config import PluginConfig
from kvstore.connectors.lmcache.keys import ChunkLayout, KeyMapper
from kvstore.connectors.lmcache.link import FailOpenLink, prefaulting_factory
from kvstore.connectors.lmcache.reads import Reads, _release
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvstore.types import BlockData

__all__ = ["KVStoreRemoteConnector", "layout_of"]

logger = logging.getLogger("kvstore.connectors.lmcache")
T = TypeVar("T")


def layout_of(metadata: Any, fmt: Any) -> ChunkLayout:
    """The full chunk's layout from LMCache's metadata and memory format."""
    return ChunkLayout(
        shapes=tuple(tuple(int(d) for d in s) for s in metadata.get_shapes()),
        dtypes=tuple(str(d).removeprefix("torch.") for d in metadata.get_dtypes()),
        fmt=str(getattr(fmt, "name", fmt)),
        chunk_size=int(metadata.chunk_size),
    )



class KVStoreRemoteConnector(Reads, RemoteConnector):
    def __init__(self, settings: PluginConfig, config: Any, metadata: Any,
                 local_cpu_backend: Any, *, link: FailOpenLink | None = None) -> None:
        super().__init__(config, metadata)  # meta_shapes, meta_fmt, single_token_size
        self.settings = settings
        self._metadata = metadata
        self._allocator = local_cpu_backend
        self.keys = KeyMapper(settings.tenant, layout_of(metadata, self.meta_fmt))
        self.link = link or FailOpenLink(
            settings.address, settings.timeout_s, settings.retry_interval_s,
            client_factory=prefaulting_factory if settings.prefault else None)
        self.link.call("connect", lambda c: None, None)  # a client (and its mapping) now
        self._pool = concurrent.futures.ThreadPoolExecutor(
            settings.threads, thread_name_prefix="kvstore-lmcache")
        self._workload = settings.workload
        self._cache_ttl_s = settings.cache_ttl_s
        #: LMCache files what a batched get returns in its local CPU cache when it
        #: has one; then the objects must be its own memory, not a leased slot.
        self.zero_copy = settings.zero_copy and not getattr(config, "local_cpu", True)
        #: Chunks handed to LMCache over a held slot / copied into its own memory.
        self.handed = {"held": 0, "copied": 0}
        self._count_lock = threading.Lock()
        #: Slots a contains held for the get that follows it.
        self.ahead = HeldAhead(settings.hold_ahead_s)
        self._hold_ahead = self.zero_copy and settings.hold_ahead_s > 0

    def __repr__(self) -> str:
        return f"<KVStoreRemoteConnector {self.settings.address} tenant={self.settings.tenant}>"

    # -- running blocking calls off LMCache's loop, bounded by timeout_s ----------
    async def _bounded(self, fn: Callable[[], T], default: T, what: str,
                       on_late: Callable[[T], None] | None = None) -> T:
        """``fn()`` on the plugin's threads; ``default`` if it takes over ``timeout_s``.
        A late result is handed to ``on_late`` (to release what it holds)."""
        future = self._pool.submit(fn)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)),
                                          self.settings.timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if on_late is not None:
                future.add_done_callback(
                    lambda f: on_late(f.result()) if f.exception() is None else None)
            if isinstance(exc, asyncio.CancelledError):
                raise
            logger.warning("kvstore %s took over %.1f s: treated as a miss", what,
                           self.settings.timeout_s)
            return default

    # -- contains -------------------------------------------------------------------
    def _contains(self, keys: Sequence[Any]) -> int:
        hit = 0
        for ns, run in self.keys.runs(keys):
            hashes = [self.keys.block_hash(keys[i]) for i in run]
            if self._hold_ahead:
                n = self.link.call("lookup", lambda c, ns=ns, hashes=hashes:
                                   self._lookup_and_hold(c, ns, hashes), 0)
            else:
                n = self.link.call("lookup", lambda c, ns=ns, hashes=hashes: int(
                    c.lookup(ns, hashes, workload=self._workload).num_hit), 0)
            hit += n
            if n < len(run):
                break
        return hit

    def _lookup_and_hold(self, client: Any, ns: str, hashes: list[bytes]) -> int:
        found, held = client.lookup_and_hold(ns, hashes, workload=self._workload)
        if held is not None:
            self.ahead.keep(ns, hashes[:found.num_hit], held)
        return int(found.num_hit)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[Any]) -> int:
        return self._contains(keys)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[Any],
                                     pin: bool = False) -> int:
        return await self._bounded(lambda: self._contains(keys), 0, "lookup")

    async def exists(self, key: Any) -> bool:
        return await self.batched_async_contains("", [key]) == 1

    def exists_sync(self, key: Any) -> bool:
        return self._contains([key]) == 1

    # -- put ------------------------------------------------------------------------
    def _put(self, keys: Sequence[Any], objs: Sequence[Any]) -> int:
        stored = 0
        try:
            for ns, run in self.keys.runs(keys):
                blocks = [BlockData(self.keys.block_hash(keys[i]), None, (),
                                    memoryview(objs[i].byte_array).cast("B")) for i in run]
                stored += self.link.call("put", lambda c, ns=ns, blocks=blocks: int(
                    c.put(ns, blocks, workload=self._workload)), 0)
                if self._cache_ttl_s > 0:
                    hashes = [b.block_hash for b in blocks]
                    self.link.call("retain", lambda c, ns=ns, hashes=hashes: c.retain(
                        ns, hashes, self._cache_ttl_s), 0)
        finally:
            _release(objs)  # the references batched_put took for this thread
        return stored

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[Any], memory_objs: list[Any]) -> None:
        """Store chunks. LMCache drops its own references when this returns, so the
        thread that copies holds one of its own until it is done."""
        for obj in memory_objs:
            obj.ref_count_up()
        await self._bounded(lambda: self._put(keys, memory_objs), 0, "put")

    async def put(self, key: Any, memory_obj: Any) -> None:
        await self.batched_put([key], [memory_obj])

    # -- the rest -------------------------------------------------------------------
    def remove_sync(self, key: Any) -> bool:
        ns, h = self.keys.namespace(key), self.keys.block_hash(key)
        return bool(self.link.call("delete", lambda c: c.delete(ns, [h]) > 0, False))

    async def list(self) -> list[str]:
        return []

    def support_ping(self) -> bool:
        return False

    async def close(self) -> None:
        """Let puts in flight end (for up to ``timeout_s``), then close the link."""
        ended = asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)
        try:
            await asyncio.wait_for(ended, self.settings.timeout_s)
        except TimeoutError:
            logger.warning("kvstore plugin closed with transfers still running")
        self.ahead.close()
        self.link.close()
