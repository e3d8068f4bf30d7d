"""The lookup: the longest stored prefix worth loading, and what to store after it.

One operation for every caller (the servicer, the trace replay, tests):
:meth:`Lookups.find` reads the index; the first lookup of a request passes it to
the policy (its plan says where the missing blocks may be stored; its moves run on
the mover) and prefetches the served blocks into the fastest tier; a repeat of
the same ``request_id`` only reads the index (counted once). :meth:`Lookups.extend`
then continues the prefix from a tier other hosts share, when there is one
(:class:`~kvstore.engine.observe.SharedHooks`), and corrects the store count by
what it found.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from operator import attrgetter, is_, itemgetter

from kvstore.engine.index import Entry
from kvstore.engine.mover import Transfer
from kvstore.engine.observe import Held
from kvstore.engine.placement import Placement
from kvstore.engine.planning import Planner
from kvstore.engine.requests import OpenRequest
from kvstore.errors import InvalidArgument
from kvstore.policies import Hint
from kvstore.types import BlockKey, Medium, Workload

__all__ = ["Lookup", "Lookups"]

#: Longest tool name a lookup passes on to the policy (client strings).
_MAX_TOOL_NAME = 128
#: An entry's tiers, the first of them, its key: read over a lookup's hits in C passes.
_TIERS, _FIRST, _KEY = attrgetter("tiers"), itemgetter(0), attrgetter("meta.key")


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a lookup answers: the served prefix's media, and how many blocks after it
    the request should offer to store (each admitted by the policy, or held already);
    blocks past that would be refused, so a client need not copy them."""

    media: list[Medium]
    store: int
    #: HBM keep the policy decided for the request (see ``Plan.keep_s``).
    keep_s: float = 0.0
    #: Whether this was a repeat of a request looked up before (counted once).
    repeat: bool = False
    #: The served prefix pinned for a co-located reader, when the lookup asked for it.
    held: Held | None = None


def check_turn(then: str, expected_gap_s: float | None) -> None:
    """A lookup's statement of how its turn ends: a known event, a sane gap."""
    if then and then not in Hint.EVENTS:
        raise InvalidArgument(
            f"then: unknown hint event {then!r}; valid: {', '.join(sorted(Hint.EVENTS))}")
    if expected_gap_s is not None and not 0 <= expected_gap_s < 1e9:
        raise InvalidArgument(f"expected_gap_ms: must be >= 0, got {expected_gap_s * 1e3!r}")


class Lookups:
    """Lookups over the placement (index, tiers, policy) and the planner."""

    def __init__(self, placement: Placement, planner: Planner) -> None:
        self.placement = placement
        self.planner = planner

    def find(self, namespace: str, hashes: list[bytes], session_id: str, workload: str,
             request_id: Hashable, num_tokens: int, then: str, tool: str,
             expected_gap_s: float | None, engine_hit_tokens: int | None = None) -> Lookup:
        """The local part of a lookup (``hashes`` checked already); see the module."""
        check_turn(then, expected_gap_s)
        pl, planner = self.placement, self.planner
        wl = Workload.parse(workload).value
        # One pass over the index in C (map), cut at the first miss: no per-hash Python
        # frame (a lookup of 1,000 stored hashes spent ~0.1 ms here in a Python loop).
        # (``list.index(None)`` would call each Entry's dataclass ``__eq__``: ``is_``.)
        found = list(map(pl.index.blocks_of(namespace).get, hashes))
        missing = list(map(is_, found, repeat(None)))
        nhit = missing.index(True) if True in missing else len(found)
        hit: list[Entry] = found[:nhit]  # type: ignore[assignment]  # (no None before nhit)
        #: the fastest tier of each hit block (one list, read by every step below)
        first: list[str] = list(map(_FIRST, map(_TIERS, hit)))
        worth = planner.geometry.worth(namespace)
        tiers = pl.tiers
        worthy = {name: worth[pl.rank(name)] for name in set(first)}
        if all(worthy.values()):  # (every tier holding a hit is worth loading from)
            served = len(first)
        else:
            served = 0
            for name in first:
                if not worthy[name]:
                    break
                served += 1
        medium = {name: tiers[name].medium for name in worthy}
        head = first if served == len(first) else first[:served]  # the served hits' tiers
        media = ([medium[head[0]]] * served if served and head.count(head[0]) == served
                 else list(map(medium.__getitem__, head)))  # (one tier: no pass per block)
        now = pl.clock()
        opened = planner.requests.get(namespace, request_id)
        if opened is not None:  # a repeat: counted once
            return Lookup(media, planner.store_count(namespace, hashes, served, now),
                          opened.keep_s, repeat=True)
        session = planner.session(namespace, session_id, hashes)
        keys: list[BlockKey] = list(map(_KEY, hit))
        keys += [BlockKey(namespace, h) for h in hashes[nhit:]]
        hit_tiers: list[str | None] = list(first)
        hit_tiers += [None] * (len(keys) - nhit)
        req = replace(planner.request_info(namespace, keys, hit_tiers, session, wl, num_tokens),
                      then=then, tool=tool[:_MAX_TOOL_NAME], expected_gap_s=expected_gap_s,
                      session_named=bool(session_id), request_id=request_id,
                      engine_hit=(None if engine_hit_tokens is None else min(
                          len(keys), engine_hit_tokens // planner.geometry.of(namespace)[1])))
        plan = pl.policy.on_request(req, now)
        keep_s = max(0.0, plan.keep_s)
        # (only the missing blocks have a plan: the ones after the hit prefix)
        planner.requests.plan(keys[nhit:], plan.admit, [True] * (len(keys) - nhit), now)
        planner.requests.open(request_id, OpenRequest(namespace, keys, session, wl, now, keep_s,
                                                      named=bool(session_id)))
        planner.sessions.used(session, keys, now)
        # tail first: the head ends most recent (one call for every hit), told to the
        # policy after the answer (see EvictionManager.on_access_many_later)
        pl.policy.on_access_many_later(keys[nhit - 1::-1] if hit else [], first[::-1], now)
        top = pl.order[0]
        if head.count(top) != served:
            submit = pl.mover.submit
            mine = frozenset(keys)
            for entry in hit[:served]:  # head first: a parent is announced before its child
                if entry.tiers[0] != top:
                    # The session is back: bring its prefix up before the engine reads it
                    # (without evicting the rest of it to make the room).
                    submit(Transfer(entry.key, entry.tiers[0], top, keep_src=True,
                                    reason="prefetch", protect=mine))
        if plan.moves:
            pl.schedule(plan.moves, "plan")
        st = pl.stats
        if served:  # (a count per tier holding a hit: a lookup's hits sit in one or two)
            for name in worthy:
                n = head.count(name)
                if n:
                    st.tier_hits[name] += n
        if pl.retention:
            for e in hit[:served]:
                pl.retention.on_hit(e.key, now)
        st.lookups += 1
        st.lookup_hit_blocks += served
        st.lookup_miss_blocks += len(hashes) - served
        admit = plan.admit
        store = 0
        for i in range(served, len(keys)):
            if hit_tiers[i] is None and keys[i] not in admit:
                break
            store += 1
        return Lookup(media, store, keep_s)

    async def extend(self, namespace: str, hashes: Sequence[bytes], found: Lookup) -> Lookup:
        """``found`` continued from the shared tier where the local prefix ends before
        ``hashes`` do (blocks other hosts stored); the store count loses what it found.
        A repeated request's statistics are not counted again."""
        shared = self.placement.shared
        if shared is None or len(found.media) >= len(hashes):
            return found
        more = await shared.extend(namespace, hashes, len(found.media), count=not found.repeat)
        if not more:
            return found
        return replace(found, media=found.media + more, store=max(0, found.store - len(more)))
