"""The DRAM pool's allocator: two-level segregated fit (TLSF) over one contiguous pool.

Why this scheme (measured with ``kvstore bench-tiers alloc``; numbers in
docs/BENCHMARKS.md): a KV sidecar that serves several models or layouts sees a few
large block sizes per model (16-token blocks: Llama-3-8B 2 MiB in bf16 / 1 MiB in
fp8, Qwen2.5-7B 896 / 448 KiB, Llama-3-70B at TP 4 1.25 MiB / 640 KiB), and clients
with odd sizes. Filling a pool with those mixed sizes:

* the previous slab allocator (one size class per distinct size, whole pages per
  class) reached a few percent of the pool with 16-256 KiB random sizes, because
  every distinct size pinned a page of its own;
* geometric size classes (the same slabs, sizes rounded up to 8 classes per
  power of two) lose up to 1/8 to rounding plus a partly filled page per class;
* a buddy allocator rounds to powers of two: 1.25 MiB blocks take 2 MiB (62%);
* TLSF rounds only to the 64-byte granule, splits free blocks and coalesces
  neighbours on free, so a pool filled from empty is used to within the rounding
  and, under LRU churn with mixed sizes, stays above 90% used.

How it works: every free range sits in one of ``levels x 16`` lists, by size
class: the first level is the power of two of its length in granules, the second
splits that power into 16 equal steps. Two bitmaps (levels with a non-empty list,
and per level the non-empty lists) find the smallest class whose every member
fits a request with two find-first-set operations; the request is rounded up to
its class boundary for that search ("good fit"), and if nothing is found the
request's own class is checked directly (its first few members). The chosen
range is split, the rest goes back to its list. Freeing merges a range with free
neighbours found through two maps (start -> length, end -> start). Allocate and
free are O(1): a handful of dict and integer operations, independent of how many
blocks the pool holds.

Pure bookkeeping: no bytes are touched here; offsets are into the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["GRANULE", "Allocation", "TlsfAllocator"]

#: Allocation granule and alignment, bytes: every slot starts on a cache line.
GRANULE = 64
_SL_LOG2 = 4
_SL = 1 << _SL_LOG2
#: How many members of the request's own class are tried when the rounded search fails.
_OWN_CLASS_PROBES = 8


@dataclass(frozen=True, slots=True)
class Allocation:
    """One slot: ``offset`` into the pool, ``slot_size`` bytes reserved there."""

    offset: int
    slot_size: int


def _class_of(n: int) -> tuple[int, int]:
    """(first level, second level) of a free range of ``n`` granules."""
    if n < _SL:
        return 0, n
    fl = n.bit_length() - 1
    return fl - _SL_LOG2 + 1, (n >> (fl - _SL_LOG2)) - _SL


def _round_to_class(n: int) -> int:
    """``n`` rounded up to the start of the next class: every range in it fits ``n``."""
    if n < _SL:
        return n
    step = 1 << (n.bit_length() - 1 - _SL_LOG2)
    return -(-n // step) * step


def _lowest_bit(x: int) -> int:
    return (x & -x).bit_length() - 1


class TlsfAllocator:
    """Ranges of ``GRANULE``-aligned sizes in a pool of ``pool_bytes`` bytes."""

    def __init__(self, pool_bytes: int):
        self.granules = pool_bytes // GRANULE
        if self.granules <= 0:
            raise ValueError(f"pool of {pool_bytes} bytes holds no {GRANULE}-byte granule")
        self.pool_bytes = self.granules * GRANULE
        levels = _class_of(self.granules)[0] + 1
        self._lists: list[list[dict[int, int]]] = [[{} for _ in range(_SL)] for _ in range(levels)]
        self._fl_map = 0
        self._sl_maps = [0] * levels
        self._by_start: dict[int, int] = {}  # free range start -> length (granules)
        self._by_end: dict[int, int] = {}  # free range end -> start
        self._live: dict[int, int] = {}  # allocated start -> length (granules)
        self.free_bytes = self.pool_bytes
        self._insert(0, self.granules)

    # ---- free lists ---------------------------------------------------------------
    def _insert(self, start: int, n: int) -> None:
        fl, sl = _class_of(n)
        self._lists[fl][sl][start] = n
        self._sl_maps[fl] |= 1 << sl
        self._fl_map |= 1 << fl
        self._by_start[start] = n
        self._by_end[start + n] = start

    def _remove(self, start: int, n: int) -> None:
        fl, sl = _class_of(n)
        members = self._lists[fl][sl]
        del members[start]
        if not members:
            self._sl_maps[fl] &= ~(1 << sl)
            if not self._sl_maps[fl]:
                self._fl_map &= ~(1 << fl)
        del self._by_start[start], self._by_end[start + n]

    def _find(self, n: int) -> tuple[int, int] | None:
        """A free range (start, length) of at least ``n`` granules, or None."""
        fl, sl = _class_of(_round_to_class(n))
        if fl < len(self._sl_maps):
            above = self._sl_maps[fl] & (-1 << sl)
            if not above:
                higher = self._fl_map & (-1 << (fl + 1))
                if higher:
                    fl = _lowest_bit(higher)
                    above = self._sl_maps[fl]
            if above:
                start, length = next(iter(self._lists[fl][_lowest_bit(above)].items()))
                return start, length
        # Nothing in a class that surely fits: members of n's own class may still.
        ofl, osl = _class_of(n)
        if ofl >= len(self._lists):
            return None
        for probe, (start, length) in enumerate(self._lists[ofl][osl].items()):
            if length >= n:
                return start, length
            if probe + 1 >= _OWN_CLASS_PROBES:
                break
        return None

    # ---- allocations --------------------------------------------------------------
    @staticmethod
    def slot_size(size: int) -> int:
        """Bytes a request of ``size`` bytes takes in the pool."""
        return -(-max(size, 1) // GRANULE) * GRANULE

    def can_alloc(self, size: int) -> bool:
        return self._find(self.slot_size(size) // GRANULE) is not None

    def alloc(self, size: int) -> Allocation | None:
        """A slot for ``size`` bytes, or ``None`` when no free range holds one."""
        n = self.slot_size(size) // GRANULE
        found = self._find(n)
        if found is None:
            return None
        start, length = found
        self._remove(start, length)
        if length > n:
            self._insert(start + n, length - n)
        self._live[start] = n
        self.free_bytes -= n * GRANULE
        return Allocation(start * GRANULE, n * GRANULE)

    def alloc_run(self, sizes: Sequence[int]) -> list[Allocation] | None:
        """Adjacent slots for ``sizes``, in order, cut from one free range (one search
        for them all); ``None`` when no free range holds them all (allocate them one
        by one then). Each is freed on its own, like one from :meth:`alloc`."""
        counts = [self.slot_size(size) // GRANULE for size in sizes]
        total = sum(counts)
        found = self._find(total) if total else None
        if found is None:
            return None
        start, length = found
        self._remove(start, length)
        if length > total:
            self._insert(start + total, length - total)
        live = self._live
        out = []
        for n in counts:
            live[start] = n
            out.append(Allocation(start * GRANULE, n * GRANULE))
            start += n
        self.free_bytes -= total * GRANULE
        return out

    def free(self, alloc: Allocation) -> None:
        start = alloc.offset // GRANULE
        n = self._live.get(start)
        if n is None or n * GRANULE != alloc.slot_size:
            raise ValueError(f"{alloc} is not a live allocation of this pool")
        del self._live[start]
        self.free_bytes += n * GRANULE
        after = self._by_start.get(start + n)
        if after is not None:
            self._remove(start + n, after)
            n += after
        before = self._by_end.get(start)
        if before is not None:
            self._remove(before, start - before)
            n += start - before
            start = before
        self._insert(start, n)

    @property
    def largest_free(self) -> int:
        """Bytes of the largest free range (diagnostics; O(number of free ranges))."""
        return max(self._by_start.values(), default=0) * GRANULE

    @property
    def free_ranges(self) -> int:
        return len(self._by_start)
