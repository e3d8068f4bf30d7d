"""Prefix reuse: the hit rate of an unbounded cache, per block.

An unbounded cache stores every block it sees and never evicts; a request's
hit is its leading blocks already stored (a prefix stops at its first miss,
as in the replay and in vLLM). Its hit rate, hit blocks / looked-up blocks, is
what no capacity or policy can beat, and what the capacity curves and sizing
advice are measured against.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from kvstore.profile.model import Reuse, Row

__all__ = ["UnboundedCache", "reuse_stats"]


class UnboundedCache:
    """Counts every block it is shown; :meth:`lookup` returns the prefix hit."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[Hashable, int] = {}

    def lookup(self, hash_ids: Sequence[Hashable]) -> int:
        counts = self.counts
        hit = 0
        for h in hash_ids:
            if h not in counts:
                break
            hit += 1
        for h in hash_ids:
            counts[h] = counts.get(h, 0) + 1
        return hit

    @property
    def distinct(self) -> int:
        return len(self.counts)

    def single_use_share(self) -> float | None:
        if not self.counts:
            return None
        return sum(1 for c in self.counts.values() if c == 1) / len(self.counts)


def reuse_stats(rows: Sequence[Row], cache: UnboundedCache | None = None) -> Reuse | None:
    """Reuse over ``rows`` (None when they carry no hashes). ``cache``: the one
    that measured the rows, for distinct-block counts (offline)."""
    looked = [r for r in rows if r.hit_blocks is not None]
    if not looked:
        return None
    lookups = sum(r.blocks for r in looked)
    hits = sum(r.hit_blocks or 0 for r in looked)
    return Reuse(lookups, hits, hits / lookups if lookups else 0.0,
                 None if cache is None else cache.distinct,
                 None if cache is None else cache.single_use_share())
