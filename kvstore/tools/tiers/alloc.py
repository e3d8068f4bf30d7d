"""How much of a DRAM pool each allocator scheme can use with mixed block sizes.

    kvstore bench-tiers alloc [--pool-mib 256] [--churn 4] [--seed 0]

For each size mix (the 16-token block sizes vLLM produces for real model shapes,
mixed in one pool; random sizes), and each scheme, it reports:

* ``fill``: payload bytes stored when the first allocation fails, over the pool;
* ``lru churn``: keep inserting (``--churn`` x the pool in bytes) and evict the
  oldest block until the new one fits: payload / pool averaged over the moments
  an insert found no room, and the lowest such moment;
* ``random churn``: the same, evicting random blocks (a policy that frees
  scattered ranges: the worst case for fragmentation);
* ``us/op``: allocator time per allocate or free.

Schemes: ``tlsf`` (what the DRAM tier uses), ``slab`` (the previous allocator:
a size class per distinct size, whole pages per class), ``slab-geo`` (the slabs
with sizes rounded up to 8 geometric classes per power of two), and for
``buddy`` the utilization its power-of-two rounding alone allows (an upper
bound; its external fragmentation only lowers it). Pure bookkeeping, no bytes.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kvstore.tiers.slab import SlabAllocator
from kvstore.tiers.tlsf import TlsfAllocator

__all__ = ["MODEL_SHAPES", "SIZE_MIXES", "main", "model_block_sizes", "vllm_block_bytes"]

KiB = 1 << 10
MiB = 1 << 20


def vllm_block_bytes(layers: int, kv_heads: int, head_dim: int, *, tokens: int = 16,
                     dtype_bytes: int = 2) -> int:
    """Bytes of one vLLM KV block holding every layer: 2 (K, V) x layers x KV heads
    (per TP rank) x head dim x tokens x dtype bytes."""
    return 2 * layers * kv_heads * head_dim * tokens * dtype_bytes


#: name -> (layers, KV heads per rank, head dim)
MODEL_SHAPES: dict[str, tuple[int, int, int]] = {
    "Llama-3-8B": (32, 8, 128),
    "Qwen2.5-7B": (28, 4, 128),
    "Llama-3-70B TP4": (80, 8 // 4, 128),
}


def model_block_sizes() -> dict[str, int]:
    """16-token block bytes per model shape, in bf16 and fp8."""
    return {
        f"{name} {dtype}": vllm_block_bytes(*shape, dtype_bytes=nbytes)
        for name, shape in MODEL_SHAPES.items()
        for dtype, nbytes in (("bf16", 2), ("fp8", 1))
    }


_MODELS = sorted(model_block_sizes().values())

SIZE_MIXES: dict[str, Callable[[random.Random], int]] = {
    "models (6 sizes)": lambda r: r.choice(_MODELS),
    "random 16-256 KiB": lambda r: r.randint(16 * KiB, 256 * KiB),
    "random 64 KiB-1 MiB": lambda r: r.randint(64 * KiB, MiB),
    "models + random 1 KiB-2 MiB": (
        lambda r: r.choice(_MODELS) if r.random() < 0.5 else r.randint(KiB, 2 * MiB)
    ),
}


class _Allocator(Protocol):
    def alloc(self, size: int) -> Any: ...
    def free(self, alloc: Any) -> None: ...


class _GeometricSlab(SlabAllocator):
    """Slabs whose slot sizes are rounded up to 8 classes per power of two."""

    def slot_size(self, size: int) -> int:
        size = super().slot_size(size)
        step = max(64, 1 << max(size.bit_length() - 4, 0))
        return -(-size // step) * step


def _slab_page(pool: int) -> int:
    page = 64 * KiB  # the page size the previous DRAM tier picked: ~pool / 64, <= 16 MiB
    while page < 16 * MiB and page * 64 < pool:
        page *= 2
    return page


SCHEMES: dict[str, Callable[[int], _Allocator]] = {
    "tlsf": TlsfAllocator,
    "slab": lambda pool: SlabAllocator(pool, _slab_page(pool)),
    "slab-geo": lambda pool: _GeometricSlab(pool, _slab_page(pool)),
}


@dataclass
class AllocResult:
    fill: float
    lru_mean: float
    lru_min: float
    random_mean: float
    random_min: float
    us_per_op: float


def _fill(a: _Allocator, mix: Callable[[random.Random], int], r: random.Random,
          live: list[tuple[Any, int]]) -> int:
    used = 0
    while True:
        size = mix(r)
        slot = a.alloc(size)
        if slot is None:
            return used
        live.append((slot, size))
        used += size


def _churn(make: Callable[[int], _Allocator], pool: int, mix: Callable[[random.Random], int],
           seed: int, churn: float, victim: str) -> tuple[float, float, float, float, int]:
    r = random.Random(seed)
    a = make(pool)
    start: list[tuple[Any, int]] = []
    used = _fill(a, mix, r, start)
    fill = used / pool
    lru: OrderedDict[int, tuple[Any, int]] = OrderedDict(enumerate(start))
    pool_list = list(start)
    samples: list[float] = []
    inserted, n, ops = 0, len(start), 0
    t0 = time.perf_counter()
    while inserted < churn * pool:
        size = mix(r)
        while (slot := a.alloc(size)) is None:
            samples.append(used / pool)
            if victim == "lru":
                _, (old, old_size) = lru.popitem(last=False)
            else:
                i = r.randrange(len(pool_list))
                pool_list[i], pool_list[-1] = pool_list[-1], pool_list[i]
                old, old_size = pool_list.pop()
            a.free(old)
            used -= old_size
            ops += 2
        ops += 1
        if victim == "lru":
            lru[n] = (slot, size)
        else:
            pool_list.append((slot, size))
        n += 1
        used += size
        inserted += size
    elapsed = time.perf_counter() - t0
    mean = sum(samples) / len(samples) if samples else used / pool
    return fill, mean, min(samples, default=mean), elapsed, ops


def measure(scheme: str, mix: str, pool: int, churn: float, seed: int) -> AllocResult:
    make, m = SCHEMES[scheme], SIZE_MIXES[mix]
    fill, lru_mean, lru_min, t1, ops1 = _churn(make, pool, m, seed, churn, "lru")
    _, rnd_mean, rnd_min, t2, ops2 = _churn(make, pool, m, seed, churn, "random")
    return AllocResult(fill, lru_mean, lru_min, rnd_mean, rnd_min, (t1 + t2) / (ops1 + ops2) * 1e6)


def buddy_bound(mix: str, seed: int, samples: int = 20_000) -> float:
    """Payload over power-of-two-rounded bytes: what a buddy allocator could use at best."""
    r = random.Random(seed)
    sizes = [SIZE_MIXES[mix](r) for _ in range(samples)]
    return sum(sizes) / sum(1 << (s - 1).bit_length() for s in sizes)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvstore bench-tiers alloc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pool-mib", type=int, default=256)
    p.add_argument("--churn", type=float, default=4.0, help="bytes inserted after the fill, x pool")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    pool = args.pool_mib * MiB
    sizes = ", ".join(f"{k} {v // KiB} KiB" for k, v in model_block_sizes().items())
    print(f"pool {args.pool_mib} MiB; model block sizes: {sizes}")
    print(f"{'mix':<30} {'scheme':<9} {'fill':>6} {'lru churn mean/min':>19} "
          f"{'random churn mean/min':>22} {'us/op':>6}")
    for mix in SIZE_MIXES:
        for scheme in SCHEMES:
            res = measure(scheme, mix, pool, args.churn, args.seed)
            print(f"{mix:<30} {scheme:<9} {res.fill:6.1%} {res.lru_mean:10.1%} /{res.lru_min:6.1%}"
                  f" {res.random_mean:13.1%} /{res.random_min:6.1%} {res.us_per_op:6.2f}")
        print(f"{mix:<30} {'buddy':<9} {buddy_bound(mix, args.seed):6.1%} (rounding bound)")


if __name__ == "__main__":
    main()
