"""Where one engine block lives in vLLM's KV tensors, for any attention layout.

vLLM hands ``register_kv_caches`` one tensor per attention layer. Whatever the
backend, each has a *block axis*: vLLM 0.32 gives standardized ``[B, H, N, C]``
views (CPU attention, FlashAttention, ... with the physical layout in the
strides); older and custom backends use ``[2, B, N, H, D]`` (FlashAttention's
K/V-first layout) or ``[B, N, H, D]`` (MLA). The block axis is the first of
the two leading axes whose length is a multiple of the engine's block count;
the multiple is the number of kernel blocks per engine block.

A block's payload body is every layer's slice of that block, moved to the
front and laid out contiguously in logical order, layer after layer. The same
code gathers and scatters every layout; :attr:`KVLayout.signature` records
shapes and dtypes so a payload is never scattered into a different layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["KVLayout", "LayerLayout", "LayoutError", "find_block_axis"]


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


@dataclass(frozen=True, slots=True)
class LayerLayout:
    name: str
    tensor: torch.Tensor
    axis: int
    ratio: int  # kernel blocks per engine block
    block_shape: tuple[int, ...]  # one engine block, block axis first (length ratio)
    nbytes: int  # bytes of one engine block of this layer

    def describe(self) -> str:
        return f"{self.tensor.dtype}{list(self.block_shape)}@{self.axis}"


class KVLayout:
    """The KV tensors of one worker and the byte layout of a block body."""

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> None:
        layers: list[LayerLayout] = []
        seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
        for name, tensor in kv_caches.items():
            # Layers that share another layer's cache (cross-layer KV sharing)
            # hold the same bytes: store them once.
            key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
            if key in seen:
                continue
            seen.add(key)
            axis, ratio = find_block_axis(tuple(tensor.shape), num_blocks)
            rest = tuple(s for i, s in enumerate(tensor.shape) if i != axis)
            block_shape = (ratio, *rest)
            numel = 1
            for s in block_shape:
                numel *= s
            layers.append(
                LayerLayout(name, tensor, axis, ratio, block_shape, numel * tensor.element_size())
            )
        if not layers:
            raise LayoutError("no KV cache tensors to register")
        self.layers = tuple(layers)
        self.num_blocks = num_blocks
        self.block_bytes = sum(layer.nbytes for layer in layers)
        self.device = layers[0].tensor.device
        self.signature = ";".join(f"{i}:{layer.describe()}" for i, layer in enumerate(layers))

    def _kernel_ids(self, layer: LayerLayout, block_ids: Sequence[int]) -> torch.Tensor:
        import torch

        ids = torch.as_tensor(list(block_ids), dtype=torch.long)
        if layer.ratio > 1:
            offsets = torch.arange(layer.ratio, dtype=torch.long)
            ids = (ids[:, None] * layer.ratio + offsets[None, :]).reshape(-1)
        return ids.to(layer.tensor.device)

    def gather(self, block_ids: Sequence[int]) -> torch.Tensor:
        """A host ``uint8`` tensor ``[len(block_ids), block_bytes]``: one body per row."""
        import torch

        n = len(block_ids)
        out = torch.empty((n, self.block_bytes), dtype=torch.uint8)
        offset = 0
        for layer in self.layers:
            picked = layer.tensor.index_select(layer.axis, self._kernel_ids(layer, block_ids))
            rows = picked.movedim(layer.axis, 0).reshape(n, -1)
            out[:, offset : offset + layer.nbytes].copy_(rows.view(torch.uint8).cpu())
            offset += layer.nbytes
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
        offset = 0
        for layer in self.layers:
            part = bodies[:, offset : offset + layer.nbytes].contiguous()
            offset += layer.nbytes
            src = part.view(layer.tensor.dtype).reshape(n * layer.ratio, *layer.block_shape[1:])
            src = src.to(layer.tensor.device, non_blocking=False).movedim(0, layer.axis)
            layer.tensor.index_copy_(layer.axis, self._kernel_ids(layer, block_ids), src)
