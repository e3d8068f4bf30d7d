"""What the workload bets would hold, keys only: the guard's evidence before a trial.

:class:`WorkloadGhost` plays a second :class:`~kvstore.policies.workload.WorkloadPolicy`
over one tier of the capacity the guard's LRU ghost has (every tier worth loading
from), with the engine's part played here as :class:`~kvstore.policies.frequency.FrequencyGhost`
plays it for the reuse counts: a request's prefix hits up to its first miss, the
policy's plan, the hits touched (tail first, as the engine does), and the run of
blocks the lookup would have said to store, placed where the policy admits them
after its victims make room. No payloads, no time: a move is instant.

Its hits minus the LRU ghost's on the same lookups are what the bets would have won
or lost had they held the tiers the whole time: while LRU leads, this is what tells
the guard the bets are worth a trial (:mod:`~kvstore.policies.guard`). It is an
estimate beside an estimate: neither ghost plays the engine's eviction of a
victim's children or its retention shield, so both are off the same way.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import compress, repeat
from operator import eq, not_, or_
from typing import Any

from kvstore.policies.base import RequestInfo, TierSpec, ghost_victims
from kvstore.policies.cost import CostModel
from kvstore.policies.workload import WorkloadPolicy

__all__ = ["WorkloadGhost"]

#: the ghost's one tier
_NAME = "ghost"
#: held -> the ghost's tier name, or None
_TIER: dict[bool, str | None] = {True: _NAME, False: None}


class WorkloadGhost:
    """A :class:`WorkloadPolicy` of the given options over one keys-only tier of
    ``capacity`` bytes."""

    __slots__ = ("hits", "policy", "tier")

    def __init__(self, capacity: int, cost: CostModel | None = None, **options: Any) -> None:
        self.tier = _NAME
        #: prefix hits over every lookup played
        self.hits = 0
        self.policy = WorkloadPolicy([TierSpec(self.tier, capacity)], cost, **options)

    def request(self, req: RequestInfo, size: int, now: float) -> int:
        """Play one lookup at ``now``; returns its prefix hits. A lookup of a chain the
        ghost holds runs no Python line per block (C-level passes); the store of new
        blocks does (the policy's inserts), as the engine's commit does."""
        pol, name = self.policy, self.tier
        tr = pol._t[name]
        keys = req.keys
        n = len(keys)
        held = list(map(tr.sizes.__contains__, keys))
        hits = held.index(False) if False in held else n
        self.hits += hits
        tiers: list[str | None] = ([name] * n if hits == n else
                                   list(map(_TIER.__getitem__, held)))
        req = replace(req, hit_tiers=tiers, worth=(), block_bytes=size)
        plan = pol.on_request(req, now)
        if hits:
            pol.on_access_many(keys[hits - 1::-1], tiers[hits - 1::-1], now)
        if hits == n or not plan.admit:
            return hits
        # What the lookup says to store: the run after the hits of blocks held or
        # admitted (the engine's store count); only the admitted ones are new.
        rest = keys[hits:]
        ok = list(map(or_, held[hits:], map(eq, map(plan.admit.get, rest), repeat(name))))
        end = ok.index(False) if False in ok else len(ok)
        new = list(compress(range(hits, hits + end), map(not_, held[hits:hits + end])))
        if not new:
            return hits
        need = len(new) * size - (tr.capacity - tr.used)
        if need > 0:
            own = set(keys)
            for v in ghost_victims(pol.victims(name, own, now), own, tr.sizes, need):
                pol.on_remove(v, name)
        fit = max(0, (tr.capacity - tr.used) // size)  # (size >= 1: the guard's)
        if fit:
            pol.on_insert_many(list(map(req.info, new[:fit])), name, now)
        return hits
