"""The DRAM tier: slots in one preallocated, pre-faulted shared-memory segment.

Co-located clients map the segment (:func:`kvstore.tiers.shm.attach_segment`)
and move bytes without protobuf: the server reserves a slot, the client writes
it, the server commits it under a key; reads go the same way by :meth:`locate`.

Capacity is enforced exactly in payload bytes: ``used_bytes`` is the sum of
the sizes of stored and reserved blocks and never exceeds ``capacity_bytes``.
Slots come from a TLSF allocator (:mod:`kvstore.tiers.tlsf`): any mix of block
sizes, 64-byte granules, O(1) allocate and free, free neighbours coalesced. The
segment is larger than the capacity by 1/64 (slot rounding and the fragmentation
that churn with mixed sizes leaves), and a put needs both payload room and a free
range, which :meth:`can_fit` checks.

``get`` returns a read-only memoryview of the slot (zero-copy): it stays valid
until the block is deleted or replaced, so the engine copies it or holds a
lease that keeps the block from being deleted. Work runs on the caller's
thread: a 1 MiB put is one memcpy (tens of microseconds).

``owner_dir`` (the server's data directory) keeps a dead server's segment from
leaking: its name is recorded there under an flock before it is created, and the
next tier on that directory unlinks it, whatever pid either had
(:mod:`kvstore.tiers.shmowner`). ``mode`` / ``gid`` let a client of another user
in the segment's group map it (:func:`kvstore.tiers.shm.create_segment`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvstore.errors import (
    BadDescriptor,
    BlockNotFound,
    InvalidBlock,
    TierUnavailable,
    UnknownReservation,
)
from kvstore.tiers._common import as_bytes_view, check_put, check_size, tier_full
from kvstore.tiers.base import Slot, Tier
from kvstore.tiers.shm import create_segment, destroy_segment, segment_name
from kvstore.tiers.shmowner import SegmentOwner
from kvstore.tiers.tlsf import Allocation, TlsfAllocator
from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["DramTier", "default_pool_bytes"]

#: Slack added to the capacity when sizing the segment (granule rounding, fragmentation).
_OVERHEAD = 1 / 64
_MIN_SLACK = 64 << 10


#: Slot ids drawn from the OS's random source per refill (one read instead of one per
#: slot: a read costs ~1 us, as much as the rest of a slot's id).
_ID_BATCH = 512
_ids: list[int] = []
os.register_at_fork(after_in_child=_ids.clear)  # a forked child draws its own


def _new_slot_id() -> int:
    """A random 63-bit slot id: a client cannot guess another client's slot."""
    if not _ids:
        _ids.extend(v >> 1 or 1 for v in
                    struct.unpack(f"<{_ID_BATCH}Q", os.urandom(8 * _ID_BATCH)))
    return _ids.pop()


def default_pool_bytes(capacity_bytes: int) -> int:
    """Segment size for a tier of ``capacity_bytes``: capacity + 1/64 (at least 64 KiB)."""
    slack = max(int(capacity_bytes * _OVERHEAD), _MIN_SLACK)
    return -(-(capacity_bytes + slack) // 4096) * 4096


@dataclass(slots=True)
class _Entry:
    slot: Slot
    alloc: Allocation
    meta: BlockMeta | None = None  # None while reserved


class DramTier(Tier):
    """Tier and :class:`~kvstore.tiers.base.SlotTier` over one shared-memory segment.

    ``pool_bytes``: segment size; default :func:`default_pool_bytes` (capacity + 1/64).
    """

    medium = Medium.CPU

    def __init__(
        self,
        capacity_bytes: int,
        name: str = "dram",
        segment_prefix: str = "kvstore",
        *,
        pool_bytes: int | None = None,
        prefault: bool = True,
        owner_dir: Path | None = None,
        mode: int = 0o600,
        gid: int | None = None,
    ):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if not segment_prefix or not segment_prefix.replace("-", "").isalnum():
            raise ValueError(
                f"segment_prefix must be letters, digits or '-', got {segment_prefix!r} "
                "(segments are named <prefix>_<random>_<n>)"
            )
        self.name = name
        self._capacity = capacity_bytes
        if pool_bytes is None:
            pool_bytes = default_pool_bytes(capacity_bytes)
        self._alloc = TlsfAllocator(pool_bytes)
        pool_bytes = self._alloc.pool_bytes
        seg = segment_name(segment_prefix, 0)
        self._owner: SegmentOwner | None = None
        if owner_dir is not None:
            self._owner = SegmentOwner.claim(owner_dir, name)
            self._owner.reclaim()
            self._owner.record([seg])  # before it exists: a crash from here on is reclaimed
        try:
            self._shm = create_segment(seg, pool_bytes, prefault=prefault, mode=mode, gid=gid)
        except BaseException:
            if self._owner is not None:
                self._owner.close()
            raise
        self._segment = self._shm.name
        self._buf: memoryview | None = self._shm.buf
        self._used = 0
        self._stored: dict[BlockKey, _Entry] = {}
        self._reserved: dict[int, _Entry] = {}
        self._slots: dict[int, _Entry] = {}  # every live slot id, reserved or stored

    # ---- Tier ---------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        return self._used

    def can_fit(self, size: int) -> bool:
        return (
            self._buf is not None
            and 0 < size <= self._capacity - self._used
            and self._alloc.can_alloc(size)
        )

    async def put(self, meta: BlockMeta, payload: bytes | memoryview) -> None:
        view = as_bytes_view(payload)
        size = check_put(self.name, self._capacity, meta, view)
        buf = self._live_buf()
        old = self._stored.get(meta.key)
        freed = old.slot.length if old is not None else 0
        if self._used - freed + size > self._capacity:
            raise tier_full(self.name, size, self._used, self._capacity)
        alloc = self._alloc.alloc(size)
        if alloc is None and old is not None:  # make room from the block being replaced
            self._drop(meta.key)
            old, freed = None, 0
            alloc = self._alloc.alloc(size)
        if alloc is None:
            raise tier_full(
                self.name, size, self._used, self._capacity, "no free range large enough"
            )
        buf[alloc.offset : alloc.offset + size] = view
        if old is not None:
            self._drop(meta.key)
        slot = Slot(self._fresh_id(), self._segment, alloc.offset, size)
        entry = self._stored[meta.key] = _Entry(slot, alloc, meta)
        self._slots[slot.slot_id] = entry
        self._used += size

    async def get(self, key: BlockKey) -> memoryview:
        slot = self.locate(key)
        return self._live_buf()[slot.offset : slot.offset + slot.length].toreadonly()

    async def contains(self, key: BlockKey) -> bool:
        return key in self._stored

    async def delete(self, key: BlockKey) -> bool:
        return self._drop(key)

    async def close(self) -> None:
        if self._buf is None:
            return
        self._stored.clear()
        self._reserved.clear()
        self._slots.clear()
        self._used = 0
        self._buf = None
        destroy_segment(self._shm)
        if self._owner is not None:
            self._owner.close()

    # ---- SlotTier -----------------------------------------------------------------
    def segments(self) -> list[tuple[str, int]]:
        return [(self._segment, self._shm.size)] if self._buf is not None else []

    def reserve(self, size: int) -> Slot:
        check_size(self.name, self._capacity, size)
        self._live_buf()
        if self._used + size > self._capacity:
            raise tier_full(self.name, size, self._used, self._capacity)
        alloc = self._alloc.alloc(size)
        if alloc is None:
            raise tier_full(
                self.name, size, self._used, self._capacity, "no free range large enough"
            )
        slot = Slot(self._fresh_id(), self._segment, alloc.offset, size)
        self._reserved[slot.slot_id] = self._slots[slot.slot_id] = _Entry(slot, alloc)
        self._used += size
        return slot

    def reserve_run(self, sizes: Sequence[int]) -> list[Slot] | None:
        """:meth:`reserve` of each of ``sizes`` at once, the slots adjacent in one free
        range; ``None`` (nothing reserved) when no free range holds them all."""
        for size in sizes:
            check_size(self.name, self._capacity, size)
        self._live_buf()
        if self._used + sum(sizes) > self._capacity:
            return None
        allocs = self._alloc.alloc_run(sizes)
        if allocs is None:
            return None
        out = []
        for size, alloc in zip(sizes, allocs, strict=True):
            slot = Slot(self._fresh_id(), self._segment, alloc.offset, size)
            self._reserved[slot.slot_id] = self._slots[slot.slot_id] = _Entry(slot, alloc)
            out.append(slot)
        self._used += sum(sizes)
        return out

    def view(self, slot: Slot) -> memoryview:
        self._check_known(slot)
        return self._live_buf()[slot.offset : slot.offset + slot.length]

    def commit(self, slot: Slot, meta: BlockMeta) -> None:
        entry = self._reservation(slot)
        if meta.size != slot.length:
            raise InvalidBlock(
                f"block {meta.key}: meta.size is {meta.size} but slot {slot.slot_id} "
                f"holds {slot.length} bytes"
            )
        del self._reserved[slot.slot_id]
        self._drop(meta.key)  # replacing a stored block frees its slot
        entry.meta = meta
        self._stored[meta.key] = entry

    def abort(self, slot: Slot) -> None:
        entry = self._reservation(slot)
        del self._reserved[slot.slot_id], self._slots[slot.slot_id]
        self._alloc.free(entry.alloc)
        self._used -= slot.length

    def locate(self, key: BlockKey) -> Slot:
        entry = self._stored.get(key)
        if entry is None:
            raise BlockNotFound(f"block {key} is not in tier {self.name!r}")
        return entry.slot

    # ---- descriptors --------------------------------------------------------------
    def check_descriptor(self, segment: str, offset: int, length: int) -> None:
        """Raise BadDescriptor unless (segment, offset, length) lies inside a segment."""
        if segment != self._segment or self._buf is None:
            raise BadDescriptor(
                f"unknown shared-memory segment {segment!r}; tier {self.name!r} serves "
                f"{[s for s, _ in self.segments()]}"
            )
        size = self._shm.size
        if offset < 0 or length <= 0 or offset + length > size:
            raise BadDescriptor(
                f"descriptor offset={offset} length={length} points outside segment "
                f"{segment!r} of {size} bytes"
            )

    # ---- internals ----------------------------------------------------------------
    def _live_buf(self) -> memoryview:
        if self._buf is None:
            raise TierUnavailable(f"tier {self.name!r} is closed")
        return self._buf

    def _fresh_id(self) -> int:
        sid = _new_slot_id()
        while sid in self._slots:
            sid = _new_slot_id()
        return sid

    def _drop(self, key: BlockKey) -> bool:
        entry = self._stored.pop(key, None)
        if entry is None:
            return False
        del self._slots[entry.slot.slot_id]
        self._alloc.free(entry.alloc)
        self._used -= entry.slot.length
        return True

    def _check_known(self, slot: Slot) -> None:
        self.check_descriptor(slot.segment, slot.offset, slot.length)
        entry = self._slots.get(slot.slot_id)
        if entry is None:
            raise UnknownReservation(f"slot {slot.slot_id} is neither reserved nor stored")
        if entry.slot != slot:
            raise BadDescriptor(f"slot {slot.slot_id} does not match its reservation {entry.slot}")

    def _reservation(self, slot: Slot) -> _Entry:
        entry = self._reserved.get(slot.slot_id)
        if entry is None:
            raise UnknownReservation(
                f"slot {slot.slot_id} is not reserved in tier {self.name!r} "
                "(never reserved, already committed or aborted, or expired)"
            )
        if entry.slot != slot:
            raise BadDescriptor(f"slot {slot.slot_id} does not match its reservation {entry.slot}")
        return entry
