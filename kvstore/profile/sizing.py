"""Sizing advice: the capacity (GB of KV) that reaches 50 / 80 / 95% of the
unbounded hit rate, the policy that gets there with the least, and a
``kvstore.toml`` fragment.

KV bytes per token = layers x KV heads x head dim x 2 (K and V) x dtype bytes;
:data:`MODELS` holds common models in bf16, ``kv_bytes_per_token`` any other.

The targets map to tiers from fastest to slowest: 50% is the hot set the
engine's own GPU cache (HBM) should hold, 80% the DRAM tier, 95% the disk tier.
Tiers are inclusive (the sidecar keeps a copy of what the engine holds, and
write-back copies DRAM to disk), so each is sized for its whole target. The
capacity a policy needs is interpolated linearly between the measured points
of its curve, which errs on the large side for a concave curve; a target the
smallest measured capacity already reaches is reported as "at most" that
capacity, and one above every measured point as "not reached".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.profile.model import Curve, Sizing, Target

__all__ = ["MODELS", "TARGETS", "ModelKV", "model_kv", "needed_blocks", "sizing"]


@dataclass(frozen=True, slots=True)
class ModelKV:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # bf16

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes


#: Published configs (config.json: num_hidden_layers, num_key_value_heads, head_dim).
MODELS: dict[str, ModelKV] = {m.name: m for m in (
    ModelKV("llama-3-8b", 32, 8, 128),
    ModelKV("llama-3-70b", 80, 8, 128),
    ModelKV("llama-3.1-405b", 126, 8, 128),
    ModelKV("qwen2.5-7b", 28, 4, 128),
    ModelKV("qwen2.5-72b", 80, 8, 128),
    ModelKV("mistral-7b", 32, 8, 128),
)}
DEFAULT_MODEL = "llama-3-8b"
#: (share of the unbounded hit rate, tier it sizes).
TARGETS: tuple[tuple[float, str], ...] = ((0.5, "hbm"), (0.8, "dram"), (0.95, "disk"))


def model_kv(name: str) -> ModelKV:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)} (or give "
                         "--kv-bytes-per-token)") from None


def needed_blocks(points: Sequence[tuple[int, float]], hit_rate: float
                  ) -> tuple[int | None, bool]:
    """Fewest blocks at which the curve (sorted (blocks, hit rate) points) reaches
    ``hit_rate``, interpolated linearly between measured points, and whether that
    is only an upper bound (reached already at the smallest measured capacity).
    (None, False) when no measured point reaches it."""
    if hit_rate <= 0:
        return 0, False
    if points and points[0][1] >= hit_rate:
        return points[0][0], True
    prev_b, prev_h = 0, 0.0
    for b, h in points:
        if h >= hit_rate:
            if h <= prev_h:
                return b, False
            need = prev_b + (b - prev_b) * (hit_rate - prev_h) / (h - prev_h)
            return max(1, math.ceil(need - 1e-9)), False  # no extra block for float noise
        if h > prev_h:
            prev_b, prev_h = b, h
    return None, False


def _gb(blocks: int, block_tokens: int, bytes_per_token: int) -> float:
    return blocks * block_tokens * bytes_per_token / 1e9


def _size(gb: float) -> str:
    return f'"{math.ceil(gb * 10) / 10:g}GB"'


def _toml(targets: Sequence[Target], model: str, bpt: int, block_tokens: int,
          source: str) -> str:
    by = {t.tier: t for t in targets}
    lines = [f"# kvstore.toml fragment for {source}",
             f"# {model}: {bpt:,} B of KV per token, {block_tokens}-token blocks "
             f"({bpt * block_tokens / 2**20:.1f} MiB each)"]
    if all(t.blocks == 0 for t in targets):
        return "\n".join([*lines, "# no block is ever reused: a KV store cannot help this "
                           "workload; keep the defaults"]) + "\n"
    hbm = by.get("hbm")
    if hbm is not None and hbm.gb is not None:
        most = " (or less)" if hbm.at_most else ""
        lines.append(f"# HBM: leave >= {hbm.gb:.1f} GB{most} of KV cache to the engine (vLLM "
                     f"--gpu-memory-utilization) for {100 * hbm.share:.0f}% of the reuse")
    policy = next((t.policy for t in (by.get("dram"), hbm, by.get("disk"))
                   if t is not None and t.policy), None)
    if policy:
        lines += ["", "[engine]", f'policy = "{policy}"']
    for tier in ("dram", "disk"):
        t = by.get(tier)
        if t is None:
            continue
        lines.append("")
        lines.append(f"[{tier}]")
        if t.gb is None:
            lines.append(f"# {100 * t.share:.0f}% of the reuse was not reached at the measured "
                         "capacities: measure larger ones (--points, --capacities)")
        else:
            bound = " or less (the smallest capacity measured)" if t.at_most else ""
            lines.append(f"capacity = {_size(t.gb)}  # {100 * t.share:.0f}% of the unbounded "
                         f"hit rate ({100 * t.hit_rate:.1f}%){bound}")
    return "\n".join(lines) + "\n"


def _best(curve: Curve, policies: Sequence[str],
          needs: dict[str, tuple[int | None, bool]]) -> str:
    """The policy that needs the fewest blocks; at equal blocks (two upper bounds
    at the smallest capacity) the higher hit rate there; then the order given."""
    def rank(p: str) -> tuple[int, float, int]:
        blocks = needs[p][0] or 0
        return blocks, -dict(curve.of(p)).get(blocks, 0.0), policies.index(p)

    return min(needs, key=rank)


def sizing(curve: Curve, block_tokens: int, model: str, kv_bytes_per_token: int,
           source: str = "this trace") -> Sizing:
    """Targets and the toml fragment from a measured curve."""
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    policies = [p for p in curve.policies() if p != "belady"]
    targets = []
    for share, tier in TARGETS:
        want = share * curve.unbounded_hit_rate
        needs = {p: n for p in policies if (n := needed_blocks(curve.of(p), want))[0] is not None}
        best = _best(curve, policies, needs) if needs and want > 0 else None
        blocks, at_most = (0, False) if want <= 0 else needs[best] if best else (None, False)
        bel_blocks, bel_at_most = needed_blocks(curve.of("belady"), want)
        targets.append(Target(
            share=share, tier=tier, hit_rate=want, blocks=blocks,
            gb=None if blocks is None else _gb(blocks, block_tokens, kv_bytes_per_token),
            policy=best, belady_blocks=bel_blocks, at_most=at_most,
            belady_at_most=bel_at_most))
    return Sizing(model, kv_bytes_per_token, block_tokens, tuple(targets),
                  _toml(targets, model, kv_bytes_per_token, block_tokens, source))
