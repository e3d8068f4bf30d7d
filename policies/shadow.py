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
may place blocks (:mod:`~kvstore.policies.guard`). Every ghost takes its victims by
the engine's rule (:func:`~kvstore.policies.children.ghost_take`: a victim's cached
descendants go before it, only as much of them as it takes) and learns from the
stores whose children a request's decode blocks are: before, none did, and behind an
engine cache the LRU ghost counted LRU up to 8 points short on reasoning traces.

They play the engine's store as it is made (measured by ``scripts/ghost_error.py``;
see docs/benchmarks/replay.md): a store of a request's decode blocks keeps the chain they
continue (``RequestInfo.continues``, set by the engine), and a ghost's store waits for
the engine's (``lookup`` plays the lookup alone, ``request`` the lookup and its store at
once; ``store`` stores later: the adaptive policy calls it when the engine's store ends,
``Policy.on_stored``, when a hint ends the request, or at once where the engine stores
nothing, :class:`~kvstore.policies.pending.PendingStores`), as the engine stores a
request's blocks when its prefill ends (a minute later for the agent trace's long
prompts, while other requests look up and store). Before, the bets' ghost counted the
bets 1 to 15 points short on the served grid's reasoning traces, and on the agent trace
behind an engine of 500 blocks the LRU ghost counted LRU 13.5 / 12.2 / 0.2
points short at DRAM 1,000 / 2,000 / 5,000; now within about a point.

Every ghost (these two and the guard's LRU ghost) plays the engine's retention shield
(:mod:`kvstore.engine.retention`) from what clients retained (:class:`Retained`, which
the adaptive policy fills from ``on_retain``): their eviction passes over the retained
keys they hold while those stay within the engine's default quota (half the ghost's
capacity, granted in the order retained) and takes them, the oldest deadline first,
only when nothing else can go (:func:`~kvstore.policies.children.ghost_take`). Without
it a ghost of LRU was not LRU where clients retain: on the generated ``retained`` kind
(six apps' shared system and tool prefixes retained for an hour), seed 4 at DRAM 74
blocks alone, sessionless, the LRU ghost hit 1,593 blocks where LRU hits 1,754 (3% of
the lookups); with the shield it hits 1,754. One tenant and one tier are assumed (the
engine's quota is per tenant and tier), and a key stays in the record where the engine
forgets an evicted block's retention. With nothing retained the ghosts do no extra work.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import replace
from itertools import compress, repeat
from operator import eq, not_, or_
from typing import Any

from kvstore.policies.base import BlockInfo, RequestInfo, TierSpec
from kvstore.policies.children import ChildIndex, ghost_take
from kvstore.policies.cost import CostModel
from kvstore.policies.counts import Counted
from kvstore.policies.frequency import FrequencyPolicy
from kvstore.policies.workload import WorkloadPolicy

__all__ = ["FrequencyGhost", "Retained", "WorkloadGhost"]

#: the ghost's one tier
_NAME = "ghost"
#: held -> the ghost's tier name, or None
_TIER: dict[bool, str | None] = {True: _NAME, False: None}


class Retained:
    """The keys a client retained (:meth:`~kvstore.policies.base.Policy.on_retain`),
    each with its deadline, in the order first retained: what the ghosts need to play
    the engine's retention shield (:mod:`kvstore.engine.retention`).

    The engine shields a retained block (its deadline after now) from the policy's
    victims while its tenant's retained bytes stay within a quota per tier (by default
    ``fraction`` 0.5 of the tier), granted in the order retained (a retain past the
    quota protects nothing); when nothing else can go, retained blocks go too, the
    oldest deadline first. :meth:`shield` plays that on a ghost: the retained keys it
    holds, first retained first, while their bytes stay within ``fraction`` of its
    capacity (one tenant; the ghost's one tier). At most ``most`` keys are remembered
    (past it, with the expired ones forgotten, a retain is refused, as the engine
    refuses past its quota); expired ones are forgotten lazily."""

    __slots__ = ("fraction", "most", "until")

    def __init__(self, fraction: float = 0.5, most: int = 1 << 16) -> None:
        self.fraction = fraction
        self.most = most
        #: key -> deadline, in the order first retained (an extension keeps its place)
        self.until: dict[Hashable, float] = {}

    def __bool__(self) -> bool:
        return bool(self.until)

    def add(self, keys: Iterable[Hashable], until: float, now: float) -> None:
        held = self.until
        for k in keys:
            d = held.get(k)
            if d is not None and d > now:
                if until > d:
                    held[k] = until  # extended: keeps its place, as the engine's does
                continue
            if d is not None:
                del held[k]  # expired: retained anew, last
            elif len(held) >= self.most:
                self.expire(now)
                if len(held) >= self.most:
                    continue
            if until > now:
                held[k] = until

    def expire(self, now: float) -> None:
        held = self.until
        for k in [k for k, d in held.items() if d <= now]:
            del held[k]

    def shield(self, sizes: Mapping[Hashable, int], capacity: int, now: float
               ) -> dict[Hashable, float]:
        """What the engine's shield would keep of a ghost holding ``sizes`` (key ->
        bytes) in ``capacity`` bytes at ``now``: the retained keys it holds, deadline
        after ``now``, first retained first while their bytes stay within ``fraction``
        of ``capacity`` (key -> deadline, in the order retained). Forgets the expired."""
        limit = int(self.fraction * capacity)
        out: dict[Hashable, float] = {}
        used = 0
        expired = False
        for k, d in self.until.items():
            if d <= now:
                expired = True
                continue
            n = sizes.get(k)
            if n is None or used + n > limit:
                continue
            used += n
            out[k] = d
        if expired:
            self.expire(now)
        return out


class WorkloadGhost:
    """A :class:`WorkloadPolicy` of the given options over one keys-only tier of
    ``capacity`` bytes."""

    __slots__ = ("children", "hits", "policy", "retained", "tier")

    def __init__(self, capacity: int, cost: CostModel | None = None, *,
                 retained: Retained | None = None, **options: Any) -> None:
        self.tier = _NAME
        #: its blocks' chains: victims go as the engine takes them
        self.children = ChildIndex()
        #: what clients retained (the engine's shield played on the ghost), or None
        self.retained = retained
        #: prefix hits over every lookup played
        self.hits = 0
        self.policy = WorkloadPolicy([TierSpec(self.tier, capacity)], cost, **options)

    def request(self, req: RequestInfo, size: int, now: float) -> int:
        """Play one lookup at ``now`` and store its blocks at once; returns its prefix
        hits."""
        hits, infos = self.lookup(req, size, now)
        if infos:
            self.store(req, infos, size, now)
        return hits

    def lookup(self, req: RequestInfo, size: int, now: float
               ) -> tuple[int, list[BlockInfo]]:
        """Play one lookup at ``now`` alone; returns its prefix hits and the blocks to
        store, which :meth:`store` stores later (the engine stores them when the
        request's prefill ends). A lookup of a chain the ghost holds runs no Python line
        per block (C-level passes); the store of new blocks does (the policy's inserts),
        as the engine's commit does."""
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
        infos: list[BlockInfo] = []
        if hits < n and plan.admit:
            # What the lookup says to store: the run after the hits of blocks held or
            # admitted (the engine's store count); only the admitted ones are new.
            rest = keys[hits:]
            ok = list(map(or_, held[hits:], map(eq, map(plan.admit.get, rest),
                                                repeat(name))))
            end = ok.index(False) if False in ok else len(ok)
            new = list(compress(range(hits, hits + end), map(not_, held[hits:hits + end])))
            infos = list(map(req.info, new))
        return hits, infos

    def store(self, req: RequestInfo, infos: list[BlockInfo], size: int, now: float) -> None:
        """Store the blocks a lookup of ``req`` said to store (those not held by now),
        after the policy's victims make room (the request's chain, and the chain it
        continues, kept); what does not fit is left out, the chain's tail first."""
        pol, name = self.policy, self.tier
        tr = pol._t[name]
        infos = [i for i in infos if i.key not in tr.sizes]
        if not infos:
            return
        need = len(infos) * size - (tr.capacity - tr.used)
        children = self.children
        if need > 0:
            own = set(req.keys)
            if req.continues:
                own.update(req.continues)
            shield = (self.retained.shield(tr.sizes, tr.capacity, now) if self.retained
                      else None)
            for v in ghost_take(children, lambda: pol.victims(name, own, now), own,
                                tr.sizes, need, shield):
                if v in tr.sizes:
                    pol.on_remove(v, name)
                    children.remove(v)
        fit = max(0, (tr.capacity - tr.used) // size)  # (size >= 1: the guard's)
        if fit:
            infos = infos[:fit]
            pol.on_insert_many(infos, name, now)
            children.add_many([(info.key, info.parent, size) for info in infos])


class FrequencyGhost:
    """What :class:`FrequencyPolicy` would hold in one tier of ``capacity`` bytes, keys
    only (no payloads): the engine's part played here (a request's prefix hits up to its
    first miss, the hits touched, the admitted blocks stored after the policy's victims
    make room), so that its hits can be compared with an LRU ghost's on the same lookups
    before the policy is trusted with the real tiers."""

    __slots__ = ("children", "policy", "retained", "tier")

    def __init__(self, capacity: int, reset: float = 20.0,
                 retained: Retained | None = None) -> None:
        self.tier = _NAME
        #: its blocks' chains: victims go as the engine takes them
        self.children = ChildIndex()
        #: what clients retained (the engine's shield played on the ghost), or None
        self.retained = retained
        self.policy = FrequencyPolicy([TierSpec(self.tier, capacity)], reset=reset)

    def request(self, req: RequestInfo, size: int, counted: Counted | None = None,
                now: float = 0.0) -> int:
        """Play one lookup and store what the counts admit at once; returns its prefix
        hits. ``counted``: as for :meth:`lookup`. ``now``: the lookup's time, for the
        retention shield only (the counts keep no time)."""
        hits, new = self.lookup(req, size, counted)
        if new:
            self.store(req, new, size, now)
        return hits

    def lookup(self, req: RequestInfo, size: int, counted: Counted | None = None
               ) -> tuple[int, list[int]]:
        """Play one lookup alone; returns its prefix hits and the positions of the keys
        the counts admitted (last first), which :meth:`store` stores later. ``counted``:
        the lookup as the real policy counted it (its :attr:`FrequencyPolicy.counted`,
        just after its ``on_request``): the ghost reads those counts instead of counting
        again. Its counts are then the real policy's, lookups it does not play
        included."""
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
            # Every count halved: on_request halved the tier's filings, and the hits are
            # touched again (without halving it refiled just the hits, in this order,
            # under the same counts: what touching them would do again).
            held = ([k for k, t in zip(keys, tiers, strict=True) if t is not None]
                    if hits < len(tiers) else keys)
            pol.on_access_many(held, [name] * len(held), 0.0)
        if not plan.admit:
            return hits, []
        return hits, [j for j in range(len(keys) - 1, -1, -1) if keys[j] in plan.admit]

    def store(self, req: RequestInfo, new: list[int], size: int, now: float = 0.0) -> None:
        """Store the positions ``new`` of ``req``'s keys the counts admitted (last
        first), after their victims make room (the request's chain, and the chain it
        continues, kept)."""
        pol, name = self.policy, self.tier
        tr = pol._t[name]
        keys = req.keys
        new = [j for j in new if keys[j] not in tr.at]
        if not new:
            return
        need = len(new) * size - (tr.capacity - tr.used)
        children = self.children
        if need > 0:
            own = set(keys)
            if req.continues:
                own.update(req.continues)
            shield = (self.retained.shield(tr.sizes, tr.capacity, now) if self.retained
                      else None)
            for v in ghost_take(children, tr.order, own, tr.sizes, need, shield):
                if v in tr.at:
                    tr.drop(v)
                    children.remove(v)
        added = [keys[j] for j in new]
        if size > 0 and len(dict.fromkeys(added)) == len(added):
            # Distinct newcomers (a chain's): each takes ``size``, so the first ones that
            # fit go in one call (the same inserts as the loop below, without a call each).
            fit = max(0, (tr.capacity - tr.used) // size)
            pol.on_insert_many([BlockInfo(k, size) for k in added[:fit]], name, 0.0)
            children.add_many([(keys[j], keys[j - 1] if j else None, size)
                               for j in new[:fit]])
            return
        for j in new:
            if tr.used + size > tr.capacity:
                break
            if keys[j] not in tr.at:
                children.add(keys[j], keys[j - 1] if j else None, size)
            pol.on_insert(BlockInfo(keys[j], size), name, 0.0)
