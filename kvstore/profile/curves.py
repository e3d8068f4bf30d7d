"""Hit rate against capacity, from the replay: the profile's only coupling to it.

Two call sites, kept here so a change of the replay is adapted in one place:
``kvstore.replay.cli.replay`` (one result with ``hit_rate`` per policy and
capacity: the sidecar's DRAM alone, that many blocks, through the served replay) and
``kvstore.replay.belady.belady_hit_rate`` (the offline optimum, the bound).

The default grid doubles down from the trace's footprint (its distinct blocks,
where nothing is ever evicted and LRU reaches the unbounded hit rate):
``footprint / 2**(points-1) ... footprint / 2, footprint``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvstore.profile.load import Progress, no_progress
from kvstore.profile.model import Curve, CurvePoint
from kvstore.replay.trace import Request

__all__ = ["DEFAULT_POINTS", "DEFAULT_POLICIES", "capacity_grid", "measure_curve"]

DEFAULT_POLICIES = ("lru", "workload")
#: Seven points: ~2-3 minutes for the shared conversation trace on two cores.
DEFAULT_POINTS = 7
BELADY = "belady"


def capacity_grid(footprint_blocks: int, points: int = DEFAULT_POINTS) -> list[int]:
    """``points`` capacities (blocks), each half the next, ending at the footprint."""
    if points < 1:
        raise ValueError(f"points must be >= 1, got {points}")
    if footprint_blocks < 1:
        raise ValueError("the trace has no blocks: no capacity curve")
    return sorted({max(1, round(footprint_blocks / 2**k)) for k in range(points)})


def measure_curve(requests: Sequence[Request], capacities: Iterable[int],
                  policies: Sequence[str], unbounded_hit_rate: float,
                  block_bytes: int | None = None, progress: bool = False,
                  bar: Progress = no_progress) -> Curve:
    """Replay ``requests`` through each policy at each capacity (the sidecar's DRAM
    alone, that many blocks), plus Belady at the same capacities."""
    from kvstore.policies.cost import CostModel
    from kvstore.replay.belady import belady_hit_rate
    from kvstore.replay.cli import replay

    caps = sorted(set(capacities))
    if not caps or caps[0] < 1:
        raise ValueError(f"capacities must be >= 1 block, got {caps}")
    cost = CostModel() if block_bytes is None else CostModel(block_bytes=block_bytes)
    points = [CurvePoint(r.policy, sum(r.tiers.values()), r.hit_rate)
              for r in replay(requests, list(policies), caps, cost, progress)]
    points += [CurvePoint(BELADY, c, belady_hit_rate(requests, c))
               for c in bar(caps, len(caps), "belady")]
    return Curve(tuple(points), unbounded_hit_rate)
