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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from kvstore.connectors.lmcache.ahead import HeldAhead
from kvstore.connectors.lmcache.config import PluginConfig
from kvstore.connectors.lmcache.fused import copy_checked
from kvstore.connectors.lmcache.keys import ChunkLayout, KeyMapper
from kvstore.connectors.lmcache.link import FailOpenLink, prefaulting_factory
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvstore.client import LeaseRead, SlotBuffer
from kvstore.client.held import HeldRead
from kvstore.errors import KVStoreError
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


def _release(objs: Any) -> None:
    for obj in objs:
        if obj is not None:
            obj.ref_count_down()


class _HeldSlot:
    """The parent allocator of a memory object over a sidecar slot: freeing the
    object (LMCache's last ``ref_count_down``, or its garbage collection) lets go of
    the slot."""

    __slots__ = ("held", "index")

    def __init__(self, held: HeldRead, index: int) -> None:
        self.held = held
        self.index = index

    def free(self, obj: Any) -> None:
        obj.invalidate()  # no second free from its __del__
        self.held.let_go(self.index)


class KVStoreRemoteConnector(RemoteConnector):
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

    # -- get ------------------------------------------------------------------------
    def _allocate(self, nbytes: int) -> Any:
        """A memory object for a payload of ``nbytes``, or None (not ours, no memory)."""
        tokens, rest = divmod(nbytes, self.single_token_size)
        if rest or not 0 < tokens <= self._metadata.chunk_size:
            logger.warning("kvstore returned %d bytes, not a whole number of tokens of %d "
                           "bytes (up to %d): treated as a miss", nbytes,
                           self.single_token_size, self._metadata.chunk_size)
            return None
        obj = self._allocator.allocate(self._metadata.get_shapes(tokens),
                                       self._metadata.get_dtypes(), self.meta_fmt,
                                       busy_loop=False)
        if obj is not None and obj.get_size() != nbytes:
            obj.ref_count_down()
            return None
        return obj

    def _get(self, keys: Sequence[Any], hold: bool = False) -> list[Any]:
        out: list[Any] = [None] * len(keys)
        for ns, run in self.keys.runs(keys):
            hashes = [self.keys.block_hash(keys[i]) for i in run]
            if hold:
                self._hold_run(ns, run, hashes, out)
            else:
                self._copy_run(ns, run, hashes, out)
        return out

    def _copy_run(self, ns: str, run: Sequence[int], hashes: list[bytes], out: list[Any]
                  ) -> None:
        got: dict[int, Any] = {}
        rest = []
        for j, ahead in enumerate(self.ahead.take(ns, hashes)):
            if ahead is None:
                rest.append(j)
                continue
            held, k = ahead
            view = held.views[k]
            obj = None if view is None else self._allocate(len(view))
            if obj is not None:
                np.copyto(np.frombuffer(obj.byte_array, dtype=np.uint8),
                          np.frombuffer(view, dtype=np.uint8))
                out[run[j]] = obj
            held.let_go(k)
        if len(rest) < len(run):
            self._count("copied", sum(1 for j in range(len(run)) if out[run[j]] is not None))
            if not rest:
                return
            run, hashes = [run[j] for j in rest], [hashes[j] for j in rest]

        def read(batch: Sequence[tuple[int, SlotBuffer]]) -> list[int]:
            """Copy each slot into its memory object, checking the copy (one pass);
            returns the indices whose bytes did not match the sidecar's checksum."""
            failed = []
            for j, slot in batch:
                try:
                    obj = got.get(j)
                    if obj is None:
                        obj = self._allocate(slot.length)
                        if obj is None:
                            continue
                        got[j] = obj
                    dst = memoryview(obj.byte_array).cast("B")
                    if slot.checksum is None:  # came over gRPC, checked by the sidecar
                        dst[:] = slot.view()
                    elif copy_checked(dst, slot.view()) != slot.checksum:
                        failed.append(j)  # a miss, and reported: the sidecar drops it
                        copied.discard(j)
                        reported.append(j)
                        continue
                    copied.add(j)
                except Exception:  # ours, not the sidecar's: this chunk is a miss
                    logger.exception("copying a kvstore chunk into LMCache memory failed")
            return failed

        copied: set[int] = set()
        reported: list[int] = []
        # Every copy was checked itself, so a lease that ran out under it makes a miss,
        # never wrong bytes: the release need not hold up the retrieve (it runs on the
        # client's threads), unless it reports a corrupt slot, which the sidecar should
        # have dropped by the time LMCache sees the miss.
        read_back: LeaseRead | None = self.link.call(
            "get", lambda c: c.lease_in_place(ns, hashes, read, verify=False), None)
        sizes = read_back.sizes if read_back is not None else None
        if read_back is not None and reported:
            with contextlib.suppress(KVStoreError):
                read_back.confirm()
        for j, size in enumerate(sizes or ()):
            if size and j in copied:
                out[run[j]] = got.pop(j)
        _release(got.values())
        self._count("copied", sum(1 for j, s in enumerate(sizes or ()) if s and j in copied))

    def _count(self, how: str, n: int) -> None:
        with self._count_lock:
            self.handed[how] += n

    def _hold_run(self, ns: str, run: Sequence[int], hashes: list[bytes], out: list[Any]
                  ) -> None:
        """Memory objects over the slots themselves: those the contains before held,
        then one hold of the rest. Chunks not handed over so (not in shared memory
        now, found in a tier shared between hosts, failed their check, or a client
        on gRPC) are copied as usual."""
        rest = []
        for j, ahead in enumerate(self.ahead.take(ns, hashes)):
            if ahead is None:
                rest.append(j)
            else:
                held, k = ahead
                out[run[j]] = self._over(held.views[k], held, k)  # kept only if not None
        fresh: HeldRead | None = None
        if rest:
            fresh = self.link.call(
                "get", lambda c: c.hold_in_place(ns, [hashes[j] for j in rest]), None)
        if fresh is not None:
            for k, j in enumerate(rest):
                view = fresh.views[k]
                if view is not None:
                    out[run[j]] = self._over(view, fresh, k)
        self._count("held", sum(1 for j in range(len(run)) if out[run[j]] is not None))
        left = [j for j in range(len(run)) if out[run[j]] is None]
        if left:
            self._copy_run(ns, [run[j] for j in left], [hashes[j] for j in left], out)

    def _over(self, view: memoryview, held: HeldRead, j: int) -> Any:
        """A memory object whose bytes are ``view`` (held slot ``j``), or None."""
        tokens, rest = divmod(len(view), self.single_token_size)
        if rest or not 0 < tokens <= self._metadata.chunk_size:
            logger.warning("kvstore returned %d bytes, not a whole number of tokens of %d "
                           "bytes (up to %d): treated as a miss", len(view),
                           self.single_token_size, self._metadata.chunk_size)
            held.let_go(j)
            return None
        try:
            shapes, dtypes = self._metadata.get_shapes(tokens), self._metadata.get_dtypes()
            meta = MemoryObjMetadata(shape=shapes[0], dtype=dtypes[0], address=0,
                                     phy_size=len(view), ref_count=1, pin_count=0,
                                     fmt=self.meta_fmt, shapes=shapes, dtypes=dtypes)
            obj = TensorMemoryObj(torch.frombuffer(view, dtype=torch.uint8), meta,
                                  _HeldSlot(held, j))
        except Exception:  # ours, not the sidecar's: this chunk is a miss
            logger.exception("wrapping a kvstore slot in an LMCache memory object failed")
            held.let_go(j)
            return None
        if obj.get_size() != len(view):
            obj.ref_count_down()
            return None
        return obj

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[Any]) -> list[Any]:
        if self._hold_ahead:  # every chunk held by the contains before: nothing to wait on
            held = self.ahead.take_all([(self.keys.namespace(k), self.keys.block_hash(k))
                                        for k in keys])
            if held is not None:
                out = [self._over(h.views[j], h, j) for h, j in held]
                self._count("held", sum(1 for o in out if o is not None))
                return out
        return await self._bounded(lambda: self._get(keys, hold=self.zero_copy),
                                   [None] * len(keys), "get", on_late=_release)

    async def _copied(self, keys: list[Any]) -> list[Any]:
        return await self._bounded(lambda: self._get(keys), [None] * len(keys), "get",
                                   on_late=_release)

    async def get(self, key: Any) -> Any:
        return (await self._copied([key]))[0]

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[Any]) -> list[Any]:
        """The consecutive prefix of chunks found; the rest is released."""
        objs = await self._copied(keys)
        n = next((i for i, obj in enumerate(objs) if obj is None), len(objs))
        _release(objs[n:])
        return objs[:n]

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
