"""Offline replays for tests: the sidecar's tiers alone (no engine cache, untimed),
through the served replay and so the server's engine over in-memory tiers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from kvstore.policies.cost import CostModel

from kvstore.replay.driver import TierBudget
from kvstore.replay.served import ServedResult, replay_served, sidecar_alone
from kvstore.replay.trace import Request


def replay(reqs: Sequence[Request], name: str, tiers: Sequence[tuple[str, int]],
           cost: CostModel | None = None, options: Mapping[str, float] | None = None
           ) -> ServedResult:
    """``reqs`` through the engine with policy ``name`` (constructed with ``options``)
    over the sidecar ``tiers`` (name, blocks), behind no engine cache
    (:func:`~kvstore.replay.served.sidecar_alone`)."""
    cfg = sidecar_alone([TierBudget(t, n) for t, n in tiers])
    return asyncio.run(replay_served(reqs, name, cfg, cost or CostModel(), options=options))
