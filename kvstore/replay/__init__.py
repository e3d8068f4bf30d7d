"""Trace replay: load traces, simulate policies over tiers, Belady bound, generators."""

from __future__ import annotations

from kvstore.replay.belady import belady_hit_rate
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.sim import ReplayResult, Simulator, TierBudget
from kvstore.replay.trace import After, Request, dump_trace, load_trace

__all__ = [
    "KINDS", "After", "GenConfig", "ReplayResult", "Request", "Simulator", "TierBudget",
    "belady_hit_rate", "dump_trace", "generate", "load_trace",
]
