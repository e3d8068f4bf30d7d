"""What the bets would hold, keys only: the guard's evidence before they place blocks.

:class:`FrequencyGhost` plays the reuse counts (the bets on traffic that names no
session) over one tier, keys only: a request's prefix hits up to its first miss, the
hits touched, the admitted blocks stored after the policy's victims make room.

:class:`WorkloadGhost` plays a second :class:`~kvstore.policies.workload.WorkloadPolicy`
over one tier of the capacity the guard's LRU ghost has (every tier worth loading
from), with the engine's part played here as :class:`FrequencyGhost` plays it for
the reuse counts: a request's prefix hits up to its first miss, the
policy's plan, the hits touched (tail first, as the engine does), and the run of
blocks the lookup would have said to store, placed where the policy admits them
after its victims make room. No payloads, no time: a move is instant.

Their hits minus the LRU ghost's on the same lookups are what the bets would have won
or lost had they held the tiers the whole time: this is what tells the guard the bets
may place blocks (:mod:`~kvstore.policies.guard`). Each is an estimate beside an
estimate: no ghost plays the engine's eviction of a victim's children or its
retention shield, so they are off the same way.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import compress, repeat
from operator import eq, not_, or_
from typing import Any

from kvstore.policies.base import BlockInfo, RequestInfo, TierSpec, ghost_victims
from kvstore.policies.cost import CostModel
from kvstore.policies.frequency import Counted, FrequencyPolicy
from kvstore.policies.workload import WorkloadPolicy

__all__ = ["FrequencyGhost", "WorkloadGhost"]

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


class FrequencyGhost:
    """What :class:`FrequencyPolicy` would hold in one tier of ``capacity`` bytes, keys
    only (no payloads): the engine's part played here (a request's prefix hits up to its
    first miss, the hits touched, the admitted blocks stored after the policy's victims
    make room), so that its hits can be compared with an LRU ghost's on the same lookups
    before the policy is trusted with the real tiers."""

    __slots__ = ("policy", "tier")

    def __init__(self, capacity: int, reset: float = 20.0) -> None:
        self.tier = "ghost"
        self.policy = FrequencyPolicy([TierSpec(self.tier, capacity)], reset=reset)

    def request(self, req: RequestInfo, size: int, counted: Counted | None = None) -> int:
        """Play one lookup; returns its prefix hits. ``counted``: the lookup as the real
        policy counted it (its :attr:`FrequencyPolicy.counted`, just after its
        ``on_request``): the ghost reads those counts instead of counting again. Its
        counts are then the real policy's, lookups it does not play included."""
        pol, name = self.policy, self.tier
        tr = pol._t[name]
        keys = req.keys
        at = tr.at
        tiers: list[str | None] = ([name] * len(keys) if all(map(at.__contains__, keys))
                                   else [name if k in at else None for k in keys])
        hits = tiers.index(None) if None in tiers else len(tiers)
        filed = pol._halvings
        info = RequestInfo(keys, tiers, req.session_id, req.workload, size, req.block_tokens,
                           req.last_tokens)
        plan = pol.on_request(info, 0.0) if counted is None else pol.on_counted(info, counted)
        if pol.counts is None or pol._halvings != filed:
            # Every count halved: on_request refiled the whole tier, and the hits are
            # touched again (without halving it refiled just the hits, in this order,
            # under the same counts: what touching them would do again).
            held = ([k for k, t in zip(keys, tiers, strict=True) if t is not None]
                    if hits < len(tiers) else keys)
            pol.on_access_many(held, [name] * len(held), 0.0)
        if not plan.admit:
            return hits
        new = [j for j in range(len(keys) - 1, -1, -1) if keys[j] in plan.admit]
        if not new:
            return hits
        need = len(new) * size - (tr.capacity - tr.used)
        if need > 0:
            for v in ghost_victims(tr.order(), set(keys), tr.sizes, need):
                tr.drop(v)
        added = [keys[j] for j in new]
        if (size > 0 and len(dict.fromkeys(added)) == len(added)
                and not any(map(tr.at.__contains__, added))):
            # Distinct newcomers (a chain's): each takes ``size``, so the first ones that
            # fit go in one call (the same inserts as the loop below, without a call each).
            fit = max(0, (tr.capacity - tr.used) // size)
            pol.on_insert_many([BlockInfo(k, size) for k in added[:fit]], name, 0.0)
            return hits
        for j in new:
            if tr.used + size > tr.capacity:
                break
            pol.on_insert(BlockInfo(keys[j], size), name, 0.0)
        return hits
