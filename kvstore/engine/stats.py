"""Counters the engine keeps (read by Stats RPC and the Prometheus collector)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["EngineStats"]


@dataclass(slots=True)
class EngineStats:
    lookups: int = 0
    lookup_hit_blocks: int = 0
    lookup_miss_blocks: int = 0
    puts: int = 0
    gets: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    tier_hits: Counter[str] = field(default_factory=Counter)
    evictions: Counter[str] = field(default_factory=Counter)
    #: (src, dst) -> bytes moved by transfers between tiers
    moved_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    corrupt_reads: int = 0
    #: Puts that stored only part of their blocks (a tier could not make room).
    puts_cut: int = 0
    #: Victims whose copy to the next tier failed (they were dropped instead).
    demotions_failed: int = 0
    #: Recovered blocks dropped at start because an ancestor was missing.
    orphans_dropped: int = 0
