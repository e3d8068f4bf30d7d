"""The get side of :class:`~.connector.KVStoreRemoteConnector`: chunks back to LMCache.

Part of the connector (see :mod:`.connector` for what LMCache calls): with
``zero_copy`` and no local CPU cache, memory objects over the sidecar's slots
themselves, held under a read lease until LMCache frees the last of them
(:class:`_HeldSlot`); otherwise each payload copied once, from the slot into a
``MemoryObj`` of LMCache's own allocator, checked as it is copied (:mod:`.fused`).
Imports LMCache (and so torch), like the connector.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from kvstore.connectors.lmcache.fused import copy_checked
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

from kvstore.client import LeaseRead, SlotBuffer
from kvstore.client.held import HeldRead
from kvstore.errors import KVStoreError

if TYPE_CHECKING:
    import threading

    from kvstore.connectors.lmcache.ahead import HeldAhead
    from kvstore.connectors.lmcache.keys import KeyMapper
    from kvstore.connectors.lmcache.link import FailOpenLink

__all__ = ["Reads"]

logger = logging.getLogger("kvstore.connectors.lmcache")
T = TypeVar("T")


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



class Reads:
    """The get half of :class:`~.connector.KVStoreRemoteConnector`."""

    if TYPE_CHECKING:
        # What this part reads of the connector (set in its __init__ and LMCache's).
        single_token_size: int
        meta_fmt: Any
        keys: KeyMapper
        link: FailOpenLink
        ahead: HeldAhead
        zero_copy: bool
        handed: dict[str, int]
        _metadata: Any
        _allocator: Any
        _hold_ahead: bool
        _count_lock: threading.Lock

        async def _bounded(self, fn: Callable[[], T], default: T, what: str,
                           on_late: Callable[[T], None] | None = None) -> T: ...

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
