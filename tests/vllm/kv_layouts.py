"""KV cache tensors shaped the way vLLM hands them to a connector, without vLLM.

vLLM 0.32 allocates one backing buffer and gives each layer a logical
``[B, H, N, C]`` view (``C`` = K and V of one head side by side) whose strides
follow the resolved physical layout (``vllm/v1/kv_cache_layout.py``): the CPU
backend uses ``LBHNC``, FlashAttention ``LBNHC`` (the old ``NHD``).
``kv-first`` is the pre-0.32 FlashAttention layout, one ``[2, B, N, H, D]``
tensor per layer, which a block does not occupy contiguously. Shared by the
unit tests, ``bench_transfer.py`` and ``scripts/gpu_check.sh``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LAYOUTS", "make_kv_caches"]

#: Physical order of the logical dims (L, B, H, N, C), outermost first.
_PERMS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "LHBNC": (0, 2, 1, 3, 4),
}
LAYOUTS = (*_PERMS, "kv-first")


def make_kv_caches(
    layout: str,
    *,
    num_layers: int = 2,
    num_blocks: int = 16,
    heads: int = 2,
    block_size: int = 32,
    head_dim: int = 32,
    dtype: Any = None,
    device: Any = "cpu",
    kernel_ratio: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """``{layer name: tensor}`` filled with random values, like ``register_kv_caches`` gets.

    ``kernel_ratio`` splits each engine block into that many kernel blocks (the
    block axis is then ``num_blocks * kernel_ratio`` long)."""
    import torch

    dtype = dtype or torch.float32
    gen = torch.Generator(device="cpu").manual_seed(seed)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]
    if layout == "kv-first":
        return {
            name: torch.randn(
                (2, num_blocks * kernel_ratio, block_size // kernel_ratio, heads, head_dim),
                generator=gen,
            ).to(device=device, dtype=dtype)
            for name in names
        }
    perm = _PERMS[layout]
    sizes = (num_layers, num_blocks * kernel_ratio, heads, block_size // kernel_ratio, 2 * head_dim)
    strides = [0] * 5
    step = 1
    for dim in reversed(perm):
        strides[dim] = step
        step *= sizes[dim]
    raw = torch.randn(step, generator=gen).to(device=device, dtype=dtype)
    return {
        name: raw.as_strided(sizes[1:], strides[1:], layer * strides[0])
        for layer, name in enumerate(names)
    }
