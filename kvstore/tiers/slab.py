"""A memcached-style slab allocator over one contiguous pool of fixed-size pages.

The DRAM tier's previous allocator, kept as the measured alternative of
``kvstore bench-tiers alloc`` (the tier now uses :mod:`kvstore.tiers.tlsf`):
with mixed block sizes every distinct size pins pages of its own, so a pool of
16-256 KiB blocks is ~4% usable.

* Slot sizes are the requested sizes rounded up to 64 bytes; each distinct slot
  size gets its own size class, created on first use.
* A size class carves slabs out of page runs: a slab is ``m`` consecutive pages
  cut into ``m * page // slot`` slots. The first slab of a class takes the
  fewest pages one slot needs; later ones take the smallest ``m`` (up to 8x
  that) that wastes at most 1/16 of the slab. A slot larger than a page thus
  gets a run of pages of its own.
* When a slab's last slot is freed its pages go back to the pool (coalesced), so
  memory moves between size classes as the block-size mix changes.

Pure bookkeeping: no bytes are touched here; offsets are into the pool.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["ALIGN", "Allocation", "SlabAllocator"]

ALIGN = 64
_MAX_WASTE = 1 / 16
_MAX_SPAN = 8


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(eq=False, slots=True)
class _Slab:
    first_page: int
    pages: int
    offset: int
    slot_size: int
    nslots: int
    next_unused: int = 0
    free: list[int] = field(default_factory=list)
    used: int = 0

    @property
    def has_room(self) -> bool:
        return self.used < self.nslots


@dataclass(slots=True)
class _SizeClass:
    slot_size: int
    span: int  # pages per slab
    partial: dict[_Slab, None] = field(default_factory=dict)  # ordered set with free slots
    slabs: int = 0


@dataclass(frozen=True, slots=True)
class Allocation:
    """One slot: ``offset`` into the pool, ``slot_size`` bytes reserved there."""

    offset: int
    slot_size: int
    slab: _Slab


class SlabAllocator:
    """Slots of exact (64-byte aligned) sizes in a pool of ``pool_bytes``."""

    def __init__(self, pool_bytes: int, page_bytes: int):
        if page_bytes <= 0 or page_bytes % ALIGN:
            raise ValueError(f"page_bytes must be a positive multiple of {ALIGN}")
        self.page_bytes = page_bytes
        self.pages = pool_bytes // page_bytes
        if self.pages <= 0:
            raise ValueError(f"pool of {pool_bytes} bytes holds no {page_bytes}-byte page")
        # Free page runs as parallel sorted lists: start page -> run length.
        self._run_starts: list[int] = [0]
        self._run_lens: list[int] = [self.pages]
        self._classes: dict[int, _SizeClass] = {}
        self.free_pages = self.pages

    # ---- size classes -------------------------------------------------------------
    def slot_size(self, size: int) -> int:
        return _round_up(max(size, 1), ALIGN)

    def _span(self, slot: int) -> int:
        base = -(-slot // self.page_bytes)
        best, best_waste = base, 1.0
        for m in range(base, base * _MAX_SPAN + 1):
            total = m * self.page_bytes
            waste = (total % slot) / total
            if waste <= _MAX_WASTE:
                return m
            if waste < best_waste:
                best, best_waste = m, waste
        return best

    def _class(self, slot: int) -> _SizeClass:
        cls = self._classes.get(slot)
        if cls is None:
            cls = self._classes[slot] = _SizeClass(slot, self._span(slot))
        return cls

    # ---- pages --------------------------------------------------------------------
    def _largest_run(self) -> int:
        return max(self._run_lens, default=0)

    def _take_pages(self, n: int) -> int | None:
        for i, length in enumerate(self._run_lens):  # first fit
            if length >= n:
                start = self._run_starts[i]
                if length == n:
                    del self._run_starts[i], self._run_lens[i]
                else:
                    self._run_starts[i] += n
                    self._run_lens[i] -= n
                self.free_pages -= n
                return start
        return None

    def _give_pages(self, start: int, n: int) -> None:
        i = bisect.bisect_left(self._run_starts, start)
        self._run_starts.insert(i, start)
        self._run_lens.insert(i, n)
        if i + 1 < len(self._run_starts) and start + n == self._run_starts[i + 1]:
            self._run_lens[i] += self._run_lens.pop(i + 1)
            del self._run_starts[i + 1]
        if i > 0 and self._run_starts[i - 1] + self._run_lens[i - 1] == start:
            self._run_lens[i - 1] += self._run_lens.pop(i)
            del self._run_starts[i]
        self.free_pages += n

    def _new_slab(self, cls: _SizeClass) -> _Slab | None:
        # A class's first slab gets the fewest pages one slot needs (a lone block of
        # an odd size must not take 8 pages); later slabs the low-waste span, else
        # the fewest pages again (a put must not fail while a run that holds it is free).
        minimum = -(-cls.slot_size // self.page_bytes)
        spans = (minimum,) if cls.slabs == 0 else (cls.span, minimum)
        for span in dict.fromkeys(spans):
            first = self._take_pages(span)
            if first is not None:
                total = span * self.page_bytes
                slab = _Slab(
                    first, span, first * self.page_bytes, cls.slot_size, total // cls.slot_size
                )
                cls.partial[slab] = None
                cls.slabs += 1
                return slab
        return None

    # ---- slots --------------------------------------------------------------------
    def can_alloc(self, size: int) -> bool:
        slot = self.slot_size(size)
        cls = self._classes.get(slot)
        if cls is not None and cls.partial:
            return True
        return self._largest_run() * self.page_bytes >= slot

    def alloc(self, size: int) -> Allocation | None:
        """A slot for ``size`` bytes, or ``None`` when no page run can hold one."""
        cls = self._class(self.slot_size(size))
        slab = next(iter(cls.partial), None) or self._new_slab(cls)
        if slab is None:
            if cls.slabs == 0:
                del self._classes[cls.slot_size]
            return None
        if slab.free:
            index = slab.free.pop()
        else:
            index = slab.next_unused
            slab.next_unused += 1
        slab.used += 1
        if not slab.has_room:
            del cls.partial[slab]
        return Allocation(slab.offset + index * slab.slot_size, slab.slot_size, slab)

    def free(self, alloc: Allocation) -> None:
        slab = alloc.slab
        cls = self._classes[slab.slot_size]
        slab.used -= 1
        if slab.used == 0:  # empty: its pages go back to the pool
            cls.partial.pop(slab, None)
            cls.slabs -= 1
            self._give_pages(slab.first_page, slab.pages)
            if cls.slabs == 0:
                del self._classes[slab.slot_size]
            return
        slab.free.append((alloc.offset - slab.offset) // slab.slot_size)
        cls.partial[slab] = None
