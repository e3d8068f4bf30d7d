"""Trace replay through the serving engine: traces, the served replay, Belady bound,
generators."""

from __future__ import annotations

from kvstore.replay.belady import belady_hit_rate
from kvstore.replay.driver import TierBudget
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.served import ServedConfig, ServedResult, replay_served, sidecar_alone
from kvstore.replay.trace import After, Request, dump_trace, load_trace

__all__ = [
    "KINDS", "After", "GenConfig", "Request", "ServedConfig", "ServedResult", "TierBudget",
    "belady_hit_rate", "dump_trace", "generate", "load_trace", "replay_served",
    "sidecar_alone",
]
