"""The replay's names: tiers, the virtual clock, block ids, the live replay's row.

Every replay plays each request through one path, the served replay's
(:mod:`kvstore.replay.node`, the event loop :mod:`kvstore.replay.served`): the
offline replay (``kvstore replay``, the profile's curves, the grid), the fleet replay
(:mod:`kvstore.replay.fleet`, one node per worker) and the live replay
(:mod:`kvstore.replay.live`, a node whose sidecar is a running server). Blocks are
one-byte stand-ins, so capacities are in blocks; the cost model prices them at the
trace's geometry (512 tokens, ``CostModel.block_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.types import Medium

__all__ = ["MEDIA", "NAMESPACE", "ReplayResult", "TierBudget", "VirtualClock", "block_hash"]

#: Namespace of replayed blocks.
NAMESPACE = "trace"
#: Medium of each replay tier name (events, and which tier served a hit). No replay
#: takes ``hbm`` (the served and the fleet replay refuse any tier outside
#: :data:`~kvstore.replay.served_config.SIDECAR_TIERS`: the GPU is the engine's own cache,
#: :mod:`kvstore.replay.engine_cache`); engine-level tests of the sidecar still build a
#: tier of that name.
MEDIA: dict[str, Medium] = {"hbm": Medium.GPU, "dram": Medium.CPU, "disk": Medium.DISK,
                            "redis": Medium.REMOTE}


def block_hash(block_id: int) -> bytes:
    """A trace block id as an 8-byte hash (its int64 form on the wire is the id)."""
    return block_id.to_bytes(8, "big")


@dataclass(frozen=True, slots=True)
class TierBudget:
    name: str
    blocks: int


class VirtualClock:
    """The replay's time: the timestamp of the request being played."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True, slots=True)
class ReplayResult:
    policy: str
    tiers: dict[str, int]
    requests: int
    lookups: int
    hit_blocks: int
    hit_rate: float
    hit_rate_by_tier: dict[str, float]
    bytes_moved: dict[str, int]
    prefill_s_saved: float
    prefill_s_total: float
    elapsed_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy, "tiers": self.tiers, "requests": self.requests,
            "lookups": self.lookups, "hit_blocks": self.hit_blocks, "hit_rate": self.hit_rate,
            "hit_rate_by_tier": self.hit_rate_by_tier, "bytes_moved": self.bytes_moved,
            "prefill_s_saved": self.prefill_s_saved, "prefill_s_total": self.prefill_s_total,
            "elapsed_s": self.elapsed_s,
        }
