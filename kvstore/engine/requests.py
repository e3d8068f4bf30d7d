"""Requests in flight: repeated lookups counted once, admission plans kept per key.

vLLM asks the connector for a waiting request's hit again on every step it
cannot schedule it; the engine passes a request to the policy once, the first
time its ``request_id`` is looked up, and answers the repeats from the index
without counting them again. A request ends with its turn-end hint, or after
``ttl_s``.

A request is known by its namespace and its id, together (a key, never a joined
string): two engines numbering their requests "0", "1", ... in two namespaces of one
sidecar are two sets of requests. The id itself is opaque: the client's string, or a
key the server scopes further (by tenant).

The policy's plan for a request (which tier each missing key may enter) is kept
per key until the key is stored or the plan expires, so requests that
interleave (lookup A, lookup B, put A) keep their own admissions. Memory is
bounded: at most ``max_open`` requests and ``max_planned`` keys, oldest first out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat

from kvstore.types import SessionKey

__all__ = ["OpenRequest", "Requests", "UNPLANNED"]

#: ``admission()`` of a key no plan covers.
UNPLANNED = "\0unplanned"


@dataclass(slots=True)
class OpenRequest:
    namespace: str
    keys: Sequence[Hashable]
    session: SessionKey
    workload: str
    started: float
    keep_s: float = 0.0  # the HBM keep the policy decided at its lookup
    #: its lookup named the session (False: the engine inferred it from the chain)
    named: bool = True


class Requests:
    def __init__(self, ttl_s: float = 600.0, max_open: int = 100_000,
                 max_planned: int = 2_000_000) -> None:
        self.ttl_s = ttl_s
        self.max_open = max_open
        self.max_planned = max_planned
        #: (namespace, request id) -> the request
        self._open: OrderedDict[tuple[str, Hashable], OpenRequest] = OrderedDict()
        #: key -> (tier or None = refused, plan expiry), oldest first
        self._plans: dict[Hashable, tuple[str | None, float]] = {}

    # -- requests -------------------------------------------------------------------
    def get(self, namespace: str, request_id: Hashable) -> OpenRequest | None:
        return self._open.get((namespace, request_id)) if request_id else None

    def open(self, request_id: Hashable, req: OpenRequest) -> None:
        if not request_id:
            return
        key = (req.namespace, request_id)
        self._open[key] = req
        self._open.move_to_end(key)
        self._expire_open(req.started)

    def close(self, namespace: str, request_id: Hashable) -> OpenRequest | None:
        return self._open.pop((namespace, request_id), None) if request_id else None

    def _expire_open(self, now: float) -> None:
        opened = self._open
        while opened:
            rid, r = next(iter(opened.items()))
            if len(opened) <= self.max_open and now - r.started <= self.ttl_s:
                return
            del opened[rid]

    # -- admission plans --------------------------------------------------------------
    def plan(self, keys: Sequence[Hashable], admit: Mapping[Hashable, str],
             missing: Sequence[bool], now: float) -> None:
        """Remember the plan for the request's missing keys (refusals too)."""
        plans = self._plans
        until = now + self.ttl_s
        get = admit.get
        pop = plans.pop
        for k, miss in zip(keys, missing, strict=True):
            if miss:
                pop(k, None)  # re-inserted: the newest plan is the last one out
                plans[k] = (get(k), until)
        if len(plans) > self.max_planned:
            for k in list(plans)[: len(plans) - self.max_planned]:
                del plans[k]

    def admissions(self, keys: Sequence[Hashable], now: float) -> list[str | None]:
        """The planned tier of each of ``keys`` (None: refused); :data:`UNPLANNED` where
        no live plan covers it. The plans are used up. (One C-level pass over the plans:
        a store of 512 blocks after its lookup spent ~1 ms here a key at a time.)"""
        got = list(map(self._plans.pop, keys, repeat(None)))
        return [UNPLANNED if p is None or p[1] < now else p[0] for p in got]

    def planned(self, key: Hashable, now: float) -> str | None:
        """The planned tier of ``key`` (None: refused or not planned), left in place."""
        p = self._plans.get(key)
        return p[0] if p is not None and p[1] >= now else None

    def forget(self, key: Hashable) -> None:
        self._plans.pop(key, None)

    def __len__(self) -> int:
        return len(self._open)
