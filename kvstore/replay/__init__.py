"""Trace replay through the serving engine: traces, the driver, Belady bound, generators."""

from __future__ import annotations

from kvstore.replay.belady import belady_hit_rate
from kvstore.replay.driver import ReplayResult, TierBudget, replay_offline
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.trace import After, Request, dump_trace, load_trace

__all__ = [
    "KINDS", "After", "GenConfig", "ReplayResult", "Request", "TierBudget",
    "belady_hit_rate", "dump_trace", "generate", "load_trace", "replay_offline",
]
