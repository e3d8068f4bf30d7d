"""KV tensors in host memory (the CPU backend): one copy between them and the slots.

A save copies each layer's part of each block straight from the KV tensor into
the block's reserved shared-memory slot; a load copies it straight back. For
layers whose blocks are contiguous runs (every vLLM 0.32 CPU layout) that is
one strided copy per layer and run of consecutive blocks; other layouts go
through one gather or scatter per layer (:class:`~.layout.LayerLayout`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import xxhash
from kvstore.connectors.vllm.layout import KVLayout, LayoutError
from kvstore.connectors.vllm.rows import ByteRows, Bytes, SlotArrays, copy_rows, host_bytes

if TYPE_CHECKING:
    from kvstore.client import SlotBuffer

__all__ = ["HostKV"]


class HostKV:
    """Copies block bodies between host KV tensors and host byte rows."""

    def __init__(self, layout: KVLayout) -> None:
        if layout.device.type != "cpu":
            raise LayoutError(f"HostKV needs KV tensors in host memory, not on {layout.device}")
        self.layout = layout
        self._bases: list[Bytes | None] = [
            host_bytes(layer.tensor) if layer.rows is not None else None
            for layer in layout.layers
        ]

    @property
    def direct(self) -> bool:
        """Whether every layer's blocks are runs of its tensor's bytes (every vLLM 0.32
        CPU layout), so that :meth:`from_slots_checked` can load them."""
        return all(b is not None for b in self._bases)

    def from_slots_checked(self, block_ids: Sequence[int], slots: Sequence[SlotBuffer],
                           header: int) -> list[int]:
        """Copy each slot's body (past its first ``header`` bytes) into its block, one
        layer's row at a time, hashing each row in the KV tensor right after its copy,
        while it is in the cache: each byte is read from memory once, where a check of
        the slot beside the copy read it twice. Returns the positions whose header and
        copied body do not hash to the slot's checksum (a slot without one is copied
        unchecked). Hashing what was copied is the stronger check: a slot overwritten
        while it was read fails as surely as a corrupt one. Needs :attr:`direct`."""
        if not self.direct:
            raise LayoutError("from_slots_checked: a layer's blocks are not runs of its tensor")
        layers = self.layout.layers
        bases: list[Bytes] = [b for b in self._bases if b is not None]
        arrays = SlotArrays()
        failed: list[int] = []
        for j, (block, slot) in enumerate(zip(block_ids, slots, strict=True)):
            src = arrays.base(slot.buffer)
            at = slot.offset + header
            h = xxhash.xxh3_64(slot.buffer[slot.offset:at]) if slot.checksum is not None else None
            for layer, base in zip(layers, bases, strict=True):
                n = layer.nbytes
                o = layer.first_byte + block * layer.block_stride
                dst = base[o:o + n]
                np.copyto(dst, src[at + layer.offset:at + layer.offset + n])
                if h is not None:
                    h.update(dst)
            if h is not None and h.intdigest() != slot.checksum:
                failed.append(j)
        arrays.clear()
        return failed

    def _kv_rows(self, i: int, block_ids: Sequence[int]) -> ByteRows | None:
        base = self._bases[i]
        if base is None:
            return None
        layer = self.layout.layers[i]
        offsets = [layer.first_byte + b * layer.block_stride for b in block_ids]
        return ByteRows.uniform(base, offsets, layer.nbytes)

    def to_bodies(self, block_ids: Sequence[int], bodies: ByteRows) -> None:
        """Copy the blocks into ``bodies`` (rows of ``block_bytes``, one per block)."""
        ids = None
        for i, layer in enumerate(self.layout.layers):
            dst = bodies.shifted(layer.offset, layer.nbytes)
            src = self._kv_rows(i, block_ids)
            if src is None:  # a logical layout: gather the layer's blocks first
                ids = self.layout.ids(block_ids) if ids is None else ids
                gathered = layer.gather_rows(ids).numpy().reshape(-1)
                src = ByteRows.uniform(
                    gathered, [k * layer.nbytes for k in range(len(block_ids))], layer.nbytes
                )
            copy_rows(dst, src)

    def from_bodies(self, block_ids: Sequence[int], bodies: ByteRows) -> None:
        """Copy ``bodies`` (rows of ``block_bytes``, one per block) into the blocks."""
        import numpy as np
        import torch

        ids = None
        for i, layer in enumerate(self.layout.layers):
            src = bodies.shifted(layer.offset, layer.nbytes)
            dst = self._kv_rows(i, block_ids)
            if dst is not None:
                copy_rows(dst, src)
                continue
            staged = np.empty(len(block_ids) * layer.nbytes, dtype=np.uint8)
            copy_rows(
                ByteRows.uniform(
                    staged, [k * layer.nbytes for k in range(len(block_ids))], layer.nbytes
                ),
                src,
            )
            ids = self.layout.ids(block_ids) if ids is None else ids
            layer.scatter_rows(ids, torch.from_numpy(staged).view(len(block_ids), layer.nbytes))
