"""Offline replays for tests: the server's engine over in-memory tiers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kvstore.policies.cost import CostModel

from kvstore.replay.driver import ReplayResult, TierBudget, replay_offline
from kvstore.replay.trace import Request


def replay(reqs: Sequence[Request], name: str, tiers: Sequence[tuple[str, int]],
           cost: CostModel | None = None) -> ReplayResult:
    """``reqs`` through the engine with policy ``name`` over ``tiers`` (name, blocks)."""
    budget = [TierBudget(t, n) for t, n in tiers]
    return asyncio.run(replay_offline(reqs, name, budget, cost or CostModel()))
