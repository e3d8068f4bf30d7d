"""Where one engine block lives in vLLM's KV tensors, for any attention layout.

vLLM hands ``register_kv_caches`` one tensor per attention layer. Whatever the
backend, each has a *block axis*: vLLM 0.32 gives standardized ``[B, H, N, C]``
views over one shared allocation (CPU attention, FlashAttention, ... with the
physical layout, e.g. ``LBHNC`` or ``LBNHC``, in the strides); older and
custom backends use ``[2, B, N, H, D]`` (FlashAttention's K/V-first layout) or
``[B, N, H, D]`` (MLA). The block axis is the first of the two leading axes
whose length is a multiple of the engine's block count; the multiple is the
number of kernel blocks per engine block.

A block's payload body is every layer's part of that block, layer after
layer. Where a layer keeps each block in one contiguous run of bytes (every
vLLM 0.32 layout with the block axis outside the heads: ``LBHNC``,
``LBNHC``, ``BLHNC``, ``BLNHC``) that part is the run itself, in physical
order, so a block moves with one plain copy per layer and a whole step's
blocks with one gather per layer (:attr:`LayerLayout.rows`). Other layouts
(K and V apart, heads outside blocks) use the logical order instead. The
:attr:`KVLayout.signature` records dtype, block shape and byte order of
every layer, so a payload is never scattered into a layout that reads its
bytes differently (and layouts that read them alike share payloads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["KVLayout", "LayerLayout", "LayoutError", "find_block_axis", "storage_bytes"]


class LayoutError(ValueError):
    """A KV tensor the connector cannot address block by block."""


def find_block_axis(shape: Sequence[int], num_blocks: int) -> tuple[int, int]:
    """``(axis, kernel_blocks_per_block)`` of the block axis in ``shape``."""
    if num_blocks <= 0:
        raise LayoutError(f"num_blocks must be positive, got {num_blocks}")
    for axis in range(min(2, len(shape))):
        size = shape[axis]
        if size >= num_blocks and size % num_blocks == 0:
            return axis, size // num_blocks
    raise LayoutError(
        f"no block axis of length k*{num_blocks} among the leading axes of shape {tuple(shape)}"
    )


def storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` tensor over the whole storage behind ``tensor`` (no copy)."""
    import torch

    storage = tensor.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return flat.set_(storage, 0, (storage.nbytes(),), (1,))


def _physical_order(shape: Sequence[int], strides: Sequence[int]) -> tuple[tuple[int, ...], bool]:
    """Dims of size > 1 from outermost to innermost in memory, and whether they are
    dense (cover exactly ``prod(shape)`` consecutive elements)."""
    dims = sorted((s, -i, i) for i, (n, s) in enumerate(zip(shape, strides, strict=True)) if n > 1)
    expected = 1
    dense = True
    for stride, _, i in dims:
        if stride != expected:
            dense = False
        expected *= shape[i]
    return tuple(i for _, _, i in reversed(dims)), dense


@dataclass(frozen=True, slots=True)
class LayerLayout:
    name: str
    tensor: torch.Tensor
    axis: int
    ratio: int  # kernel blocks per engine block
    block_shape: tuple[int, ...]  # one engine block, block axis first (length ratio)
    nbytes: int  # bytes of one engine block of this layer
    offset: int  # where this layer's part starts in a block body
    order: tuple[int, ...]  # physical order of the block's dims (outermost first)
    #: ``uint8 [num_blocks, nbytes]``: block ``b``'s bytes as row ``b`` (a view of the
    #: KV memory), when every block is one contiguous run; else ``None``.
    rows: torch.Tensor | None
    #: Byte offset of block 0 in :func:`storage_bytes` of ``tensor`` and the byte
    #: distance between blocks (``rows`` layers only).
    first_byte: int
    block_stride: int

    def describe(self) -> str:
        """What a body's bytes of this layer mean: dtype, block shape and byte order
        (two layouts with the same description exchange payloads)."""
        order = self.order if self.rows is not None else tuple(
            i for i, n in enumerate(self.block_shape) if n > 1
        )
        return f"{self.tensor.dtype}{list(self.block_shape)}/{''.join(map(str, order))}"

    def kernel_ids(self, block_ids: torch.Tensor) -> torch.Tensor:
        import torch

        if self.ratio == 1:
            return block_ids
        offsets = torch.arange(self.ratio, dtype=torch.long, device=block_ids.device)
        return (block_ids[:, None] * self.ratio + offsets[None, :]).reshape(-1)

    def gather_rows(self, block_ids: torch.Tensor) -> torch.Tensor:
        """``uint8 [n, nbytes]`` (contiguous, on the tensor's device): this layer's part
        of each block. ``block_ids`` is a ``long`` tensor on the same device."""
        import torch

        if self.rows is not None:
            return self.rows.index_select(0, block_ids)
        n = block_ids.numel()
        picked = self.tensor.index_select(self.axis, self.kernel_ids(block_ids))
        return picked.movedim(self.axis, 0).reshape(n, -1).view(torch.uint8)

    def scatter_rows(self, block_ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Write ``rows`` (``uint8 [n, nbytes]``, on the tensor's device) into the blocks."""
        if self.rows is not None:
            self.rows.index_copy_(0, block_ids, rows)
            return
        n = block_ids.numel()
        src = rows.view(self.tensor.dtype).reshape(n * self.ratio, *self.block_shape[1:])
        self.tensor.index_copy_(self.axis, self.kernel_ids(block_ids), src.movedim(0, self.axis))


def _layer(name: str, tensor: torch.Tensor, num_blocks: int, offset: int) -> LayerLayout:
    axis, ratio = find_block_axis(tuple(tensor.shape), num_blocks)
    rest = tuple(s for i, s in enumerate(tensor.shape) if i != axis)
    block_shape = (ratio, *rest)
    numel = 1
    for s in block_shape:
        numel *= s
    esize = tensor.element_size()
    strides = (tensor.stride(axis), *(s for i, s in enumerate(tensor.stride()) if i != axis))
    order, dense = _physical_order(block_shape, strides)
    rows: torch.Tensor | None = None
    first_byte = block_stride = 0
    if dense and all(s >= 0 for s in tensor.stride()) and tensor.stride(axis) * ratio >= numel:
        first_byte = int(tensor.storage_offset()) * esize
        block_stride = tensor.stride(axis) * ratio * esize
        rows = storage_bytes(tensor).as_strided(
            (num_blocks, numel * esize), (block_stride, 1), first_byte
        )
    return LayerLayout(
        name, tensor, axis, ratio, block_shape, numel * esize, offset, order, rows,
        first_byte, block_stride,
    )


class KVLayout:
    """The KV tensors of one worker and the byte layout of a block body."""

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> None:
        layers: list[LayerLayout] = []
        index: dict[str, int] = {}
        seen: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int] = {}
        offset = 0
        for name, tensor in kv_caches.items():
            # Layers that share another layer's cache (cross-layer KV sharing)
            # hold the same bytes: store them once.
            key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
            if key in seen:
                index[name] = seen[key]
                continue
            layer = _layer(name, tensor, num_blocks, offset)
            seen[key] = index[name] = len(layers)
            layers.append(layer)
            offset += layer.nbytes
        if not layers:
            raise LayoutError("no KV cache tensors to register")
        self.layers = tuple(layers)
        #: vLLM layer name -> index in :attr:`layers` (shared layers map to their source).
        self.index = index
        self.num_blocks = num_blocks
        self.block_bytes = offset
        self.device = layers[0].tensor.device
        self.signature = ";".join(f"{i}:{layer.describe()}" for i, layer in enumerate(layers))

    def ids(self, block_ids: Sequence[int]) -> torch.Tensor:
        import torch

        return torch.as_tensor(list(block_ids), dtype=torch.long).to(self.device)

    def gather(self, block_ids: Sequence[int]) -> torch.Tensor:
        """A host ``uint8`` tensor ``[len(block_ids), block_bytes]``: one body per row."""
        import torch

        ids = self.ids(block_ids)
        out = torch.empty((len(block_ids), self.block_bytes), dtype=torch.uint8)
        for layer in self.layers:
            out[:, layer.offset : layer.offset + layer.nbytes].copy_(layer.gather_rows(ids).cpu())
        return out

    def scatter(self, block_ids: Sequence[int], bodies: torch.Tensor) -> None:
        """Write ``bodies`` (``uint8 [len(block_ids), block_bytes]``) into the blocks."""
        import torch

        n = len(block_ids)
        if tuple(bodies.shape) != (n, self.block_bytes) or bodies.dtype != torch.uint8:
            raise LayoutError(
                f"bodies must be uint8 [{n}, {self.block_bytes}], "
                f"got {bodies.dtype} {list(bodies.shape)}"
            )
        ids = self.ids(block_ids)
        for layer in self.layers:
            part = bodies[:, layer.offset : layer.offset + layer.nbytes].contiguous()
            layer.scatter_rows(ids, part.to(self.device))
