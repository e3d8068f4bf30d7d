"""The cost model: is a hit in a tier worth loading, or is recomputing faster?

Pure arithmetic over stated constants. Defaults describe Qwen2.5-7B (28 layers,
4 KV heads, head dim 128, bf16: 57,344 bytes of KV per token) on one H100-class
GPU, with the Mooncake trace's 512-token blocks: one block is ~29.4 MB, and a
1,362-block budget is 40 GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["READ_BYTES_PER_S", "CostModel", "read_bytes_per_s"]

#: Read bandwidth into the serving engine per tier, bytes/s: the one table the
#: server and the replay price loads with. ``hbm`` is the engine's own cache (a
#: hit there is used in place); ``dram`` a shared-memory read plus the copy to the
#: GPU; ``disk`` local NVMe; ``redis`` a network fetch.
READ_BYTES_PER_S: dict[str, float] = {"hbm": 1e13, "dram": 20e9, "disk": 3e9, "redis": 1e9}


def read_bytes_per_s(tier: str) -> float:
    """Bandwidth of a tier by name (1 GB/s for a name the table does not know)."""
    return READ_BYTES_PER_S.get(tier, 1e9)


class TierSpec(Protocol):
    """What the cost model reads of a tier (:class:`kvstore.policies.base.TierSpec`;
    named structurally so the policy interface, which carries a cost model, and the
    model do not import each other)."""

    @property
    def read_bytes_per_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class CostModel:
    """Prefill speed and block geometry; tier bandwidths come from :class:`TierSpec`."""

    #: Prefill throughput of the engine, tokens per second.
    prefill_tokens_per_s: float = 10_000.0
    #: Tokens per block (Mooncake traces: 512).
    block_tokens: int = 512
    #: Bytes of KV per block (Qwen2.5-7B bf16: 57,344 B/token x 512 tokens).
    block_bytes: int = 57_344 * 512

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be > 0")
        if self.block_tokens <= 0 or self.block_bytes <= 0:
            raise ValueError("block_tokens and block_bytes must be > 0")

    def recompute_s(self, tokens: int) -> float:
        """Seconds to prefill ``tokens`` from scratch."""
        return tokens / self.prefill_tokens_per_s

    def load_s(self, tier: TierSpec, nbytes: int) -> float:
        """Seconds to read ``nbytes`` from ``tier`` into the engine."""
        return nbytes / tier.read_bytes_per_s

    def worth_loading(self, tier: TierSpec, nbytes: int | None = None,
                      tokens: int | None = None) -> bool:
        """True when loading from ``tier`` beats recomputing the same tokens."""
        size = self.block_bytes if nbytes is None else nbytes
        ntok = self.block_tokens if tokens is None else tokens
        return self.load_s(tier, size) < self.recompute_s(ntok)

    def saved_s(self, tier: TierSpec, nbytes: int | None = None,
                tokens: int | None = None) -> float:
        """Prefill seconds saved by a hit in ``tier`` (0 when it would lose)."""
        size = self.block_bytes if nbytes is None else nbytes
        ntok = self.block_tokens if tokens is None else tokens
        return max(0.0, self.recompute_s(ntok) - self.load_s(tier, size))
