"""Admission planning: which tier each new block of a request may enter.

The policy sees a request once, at its first lookup, and its plan (a tier, or a
refusal, per missing block) is kept in :class:`~kvstore.engine.requests.Requests`
until the blocks arrive. A store that no live plan covers (blocks put without a
lookup, or after the plan expired) makes a request of its own here. Both store
front ends (:mod:`kvstore.engine.store`) and the lookup ask this one planner, so
a block is admitted by the same rule whichever way its bytes come in.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import replace
from itertools import repeat

from kvstore.engine.geometry import Geometry
from kvstore.engine.placement import Placement
from kvstore.engine.requests import UNPLANNED, Requests
from kvstore.engine.sessions import Sessions
from kvstore.errors import InvalidArgument
from kvstore.policies import Hint, RequestInfo
from kvstore.types import BlockKey, SessionKey, Workload

__all__ = ["Planner", "check_hint"]


def check_hint(hint: Hint, namespace: str, request_id: Hashable) -> Hint:
    """A hint as a client may send it: a namespace and a session (its id, or a request
    looked up before), a known event, a finite gap >= 0, a known workload."""
    if not namespace or not (request_id or hint.session_id):
        raise InvalidArgument(
            "a hint names its session by namespace and session_id (sessions are scoped "
            "by namespace), or by namespace and the request_id of a request looked up "
            "before (request ids are scoped by namespace too)")
    if hint.event not in Hint.EVENTS:
        raise InvalidArgument(
            f"Hint: unknown event {hint.event!r}; valid: {', '.join(Hint.EVENTS)}")
    gap = hint.expected_gap_s
    if gap is not None and (not math.isfinite(gap) or gap < 0):
        raise InvalidArgument(
            "Hint: expected_gap_ms must be a finite number >= 0 (0 = unknown), got "
            f"{gap * 1e3!r}")
    return replace(hint, workload=Workload.parse(hint.workload).value)


class Planner:
    """Requests, sessions and block geometry, turned into the policy's plans."""

    def __init__(self, placement: Placement, requests: Requests, sessions: Sessions,
                 geometry: Geometry) -> None:
        self.placement = placement
        self.requests = requests
        self.sessions = sessions
        self.geometry = geometry

    def session(self, namespace: str, session_id: str, hashes: Sequence[bytes]) -> SessionKey:
        """The session a request belongs to: as named, or inferred from its chain."""
        return SessionKey(namespace, session_id or self.sessions.infer(namespace, hashes))

    def request_info(self, namespace: str, keys: list[BlockKey],
                     hit_tiers: list[str | None], session: SessionKey, workload: str,
                     num_tokens: int, block_bytes: int = 0) -> RequestInfo:
        """What the policy is told of a request."""
        geo = self.geometry
        tokens = geo.of(namespace)[1]
        last = tokens
        if num_tokens > 0 and keys and geo.known(namespace):
            # Only with the namespace's real block size (the default one would call a
            # full last block of a first request partial, and the policy skip it).
            last = max(1, min(tokens, num_tokens - (len(keys) - 1) * tokens))
        return RequestInfo(keys, hit_tiers, session, workload,
                           block_bytes or geo.stored_bytes(namespace), tokens, last,
                           geo.worth(namespace))

    def admissions(self, namespace: str, hashes: Sequence[bytes], last_tokens: int,
                   session_id: str, workload: str, request_id: Hashable, now: float,
                   block_bytes: int = 0) -> list[str | None]:
        """The tier each new block may enter (None: refused), from its request's plan;
        blocks no plan covers (stored without a lookup) get a request of their own."""
        requests = self.requests
        out = requests.admissions(list(map(BlockKey, repeat(namespace), hashes)), now)
        unplanned = [i for i, t in enumerate(out) if t is UNPLANNED]
        if unplanned:
            opened = requests.get(namespace, request_id)
            session = (opened.session if opened is not None else
                       self.session(namespace, session_id, [hashes[i] for i in unplanned]))
            keys = [BlockKey(namespace, hashes[i]) for i in unplanned]
            req = self.request_info(namespace, keys, [None] * len(keys), session, workload, 0,
                                    block_bytes)
            if last_tokens:
                req = replace(req, last_tokens=last_tokens)
            # Named if this store names it, or the lookup that opened its request did
            # (decode blocks saved under the request of an unnamed lookup are unnamed too).
            if not session_id and (opened is None or not opened.named):
                req = replace(req, session_named=False)
            if opened is not None:  # (decode blocks: the store keeps the chain they continue)
                req = replace(req, continues=opened.keys, request_id=request_id)
            plan = self.placement.policy.on_request(req, now)
            self.sessions.used(session, keys, now)
            for i, k in zip(unplanned, keys, strict=True):
                out[i] = plan.admit.get(k)
            if plan.moves:
                self.placement.schedule(plan.moves, "plan")
        return out

    def request_keys(self, namespace: str, hashes: Sequence[bytes], request_id: Hashable,
                     parent: bytes | None = None) -> set[Hashable]:
        """Keys a store must not evict: the blocks stored and those of the request they
        belong to (its lookup's chain; without a known request, the prefix above
        ``parent``). The blocks stored count with a known request too: a request's
        decode blocks, saved after its lookup, are not in its chain, and a store that
        evicted the first of them to make room for the next kept a tail no prefix
        lookup reaches."""
        # (plain tuples: equal to the BlockKeys they stand for, and hashed the same,
        # made in C; a BlockKey each was 4% of a commit's CPU)
        keys: set[Hashable] = set(zip(repeat(namespace), hashes))
        opened = self.requests.get(namespace, request_id)
        if opened is not None:
            keys.update(opened.keys)
            return keys
        blocks = self.placement.index.blocks_of(namespace)
        while parent is not None and (entry := blocks.get(parent)) is not None:
            if entry.key in keys:
                break  # a cycle of parent links
            keys.add(entry.key)
            parent = entry.meta.parent_hash
        return keys

    def meta_session(self, namespace: str, session_id: str, request_id: Hashable,
                     hashes: Sequence[bytes] = ()) -> str:
        """The session a new block is recorded under (unscoped: as the client named it,
        or as the engine inferred it from the request's chain)."""
        if session_id:
            return session_id
        opened = self.requests.get(namespace, request_id)
        if opened is not None:
            return opened.session.session_id
        if hashes:
            return self.session(namespace, "", hashes).session_id
        return ""

    def store_count(self, namespace: str, hashes: Sequence[bytes], served: int,
                    now: float) -> int:
        """Blocks after the served prefix a repeated lookup should offer to store."""
        blocks = self.placement.index.blocks_of(namespace)
        planned = self.requests.planned
        n = 0
        for h in hashes[served:]:
            if h not in blocks and planned(BlockKey(namespace, h), now) is None:
                break
            n += 1
        return n

    def hint(self, hint: Hint, namespace: str, request_id: Hashable) -> int:
        """Let the policy move the blocks of the hint's session (a checked hint: see
        ``Engine.hint``); returns how many transfers it queued."""
        opened = self.requests.close(namespace, request_id)
        if opened is not None:
            session = opened.session
        elif hint.session_id:
            session = SessionKey(namespace, hint.session_id)
        else:
            raise InvalidArgument(
                f"a hint names its session by namespace and session_id, or by the request_id "
                f"of a request looked up before: no request {request_id!r} is open in "
                f"namespace {namespace!r}")
        pl = self.placement
        now = pl.clock()
        index = pl.index
        held = [(k, e.tiers[0]) for k in self.sessions.keys(session)
                if (e := index.get(k)) is not None]  # type: ignore[arg-type]
        moves = pl.policy.on_hint(replace(hint, session_id=session,
                                          request_id=request_id if opened else None),
                                  held, now)
        if hint.event == "session_end":
            free = set(self.sessions.end(session))
            moves = [m for m in moves if m.dst is not None or m.key in free]
        return pl.schedule(moves, f"hint:{hint.event}")
