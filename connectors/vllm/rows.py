"""Copies between equal-length byte rows that lie anywhere in host memory.

Everything the connector moves on the host is a set of rows of the same
length: one layer's part of each block, in the KV cache (a block's run of
bytes), in a shared-memory slot (at the block's body offset plus the layer's
offset) or in a staging buffer. :class:`ByteRows` names them by a flat
``uint8`` base tensor per row and a byte offset; :func:`copy_rows` copies
row ``i`` of one set to row ``i`` of another, one strided copy per run of
rows that are evenly spaced on both sides (consecutive engine blocks into
consecutive slots are one run), so a step's blocks move in a few large
copies rather than one small copy per block and layer.

The copies are numpy's: single-threaded, at memcpy speed for strided rows,
and without the GIL. torch's ``copy_`` splits a copy over its intra-op
threads, which on a busy 2-core host measured 2-7x slower than one thread,
and the engine's forward wants those threads anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from kvstore.client import SlotBuffer

Bytes = np.ndarray[tuple[int], np.dtype[np.uint8]]

__all__ = ["ByteRows", "SlotArrays", "copy_rows", "copy_rows_parallel", "host_bytes"]


def host_bytes(tensor: torch.Tensor) -> Bytes:
    """A flat ``uint8`` array over a host tensor's whole storage (no copy)."""
    from kvstore.connectors.vllm.layout import storage_bytes

    return storage_bytes(tensor).numpy()


@dataclass(frozen=True, slots=True)
class ByteRows:
    """Row ``i`` is ``bases[i][offsets[i] : offsets[i] + length]`` (flat ``uint8`` bases)."""

    bases: Sequence[Bytes]
    offsets: Sequence[int]
    length: int

    @classmethod
    def uniform(cls, base: Bytes, offsets: Sequence[int], length: int) -> ByteRows:
        return cls([base] * len(offsets), offsets, length)

    def shifted(self, delta: int, length: int) -> ByteRows:
        """The same rows, ``delta`` bytes further in, ``length`` long (one layer's part)."""
        return ByteRows(self.bases, [o + delta for o in self.offsets], length)


def _view(base: Bytes, offset: int, count: int, step: int, length: int) -> np.ndarray:
    end = offset + (count - 1) * step + length
    if offset < 0 or end > base.shape[0]:
        raise ValueError(
            f"rows {offset}..{end} lie outside their buffer of {base.shape[0]} bytes"
        )
    if count == 1:
        return base[offset : offset + length]
    return np.lib.stride_tricks.as_strided(
        base[offset:], (count, length), (step, 1), writeable=base.flags.writeable
    )


def copy_rows(dst: ByteRows, src: ByteRows) -> int:
    """Copy every row of ``src`` to the same row of ``dst``; returns the copies made."""
    n = len(dst.offsets)
    if len(src.offsets) != n or dst.length != src.length:
        raise ValueError(
            f"copy_rows: {len(src.offsets)} rows of {src.length} bytes into "
            f"{n} rows of {dst.length} bytes"
        )
    length = dst.length
    copies = 0
    i = 0
    while i < n:
        db, sb = dst.bases[i], src.bases[i]
        j = i + 1
        dstep = sstep = 0
        if j < n and dst.bases[j] is db and src.bases[j] is sb:
            dstep = dst.offsets[j] - dst.offsets[i]
            sstep = src.offsets[j] - src.offsets[i]
            if dstep >= length and sstep > 0:  # evenly spaced, rows of dst never overlap
                while (
                    j < n
                    and dst.bases[j] is db
                    and src.bases[j] is sb
                    and dst.offsets[j] - dst.offsets[j - 1] == dstep
                    and src.offsets[j] - src.offsets[j - 1] == sstep
                ):
                    j += 1
            else:
                j = i + 1
        count = j - i
        np.copyto(
            _view(db, dst.offsets[i], count, dstep, length),
            _view(sb, src.offsets[i], count, sstep, length),
        )
        copies += 1
        i = j
    return copies


def copy_rows_parallel(dst: ByteRows, src: ByteRows, pool: Executor | None, parts: int) -> int:
    """:func:`copy_rows` split into ``parts`` contiguous groups of rows run on ``pool``
    (numpy copies release the GIL): one thread's memcpy does not saturate a server's
    memory or a PCIe link. Without a pool, or for few rows, one call."""
    n = len(dst.offsets)
    if pool is None or parts <= 1 or n < 2:
        return copy_rows(dst, src)
    bounds = [n * k // parts for k in range(parts + 1)]
    futures = [
        pool.submit(copy_rows, _part(dst, a, b), _part(src, a, b))
        for a, b in zip(bounds, bounds[1:], strict=False)
        if b > a
    ]
    return sum(f.result() for f in futures)


def _part(rows: ByteRows, start: int, end: int) -> ByteRows:
    return ByteRows(rows.bases[start:end], rows.offsets[start:end], rows.length)


class SlotArrays:
    """Flat ``uint8`` arrays over the buffers that slots lie in, one per buffer.

    Over shared memory every slot of a batch lies in one segment, so a batch has
    one base and adjacent slots form runs. Made per batch and dropped after it:
    an array over a segment keeps the segment's buffer exported.
    """

    def __init__(self) -> None:
        self._bases: dict[int, tuple[memoryview, Bytes]] = {}

    def base(self, buffer: memoryview) -> Bytes:
        found = self._bases.get(id(buffer))
        if found is not None and found[0] is buffer:
            return found[1]
        array: Bytes = np.frombuffer(buffer, dtype=np.uint8)
        self._bases[id(buffer)] = (buffer, array)
        return array

    def rows(self, slots: Iterable[SlotBuffer], skip: int, length: int) -> ByteRows:
        """Rows ``length`` bytes long starting ``skip`` bytes into each slot."""
        bases: list[Bytes] = []
        offsets: list[int] = []
        for slot in slots:
            bases.append(self.base(slot.buffer))
            offsets.append(slot.offset + skip)
        return ByteRows(bases, offsets, length)

    def clear(self) -> None:
        self._bases.clear()
