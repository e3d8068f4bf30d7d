"""Routers of the fleet replay: pick a worker for each request.

Routers (:data:`ROUTERS`), for each request in timestamp order:

``random``
    a worker uniformly at random (seeded).
``load``
    the worker with the least outstanding work; ties: fewest requests so far.
``prefix``
    the worker with the least ``outstanding work - prefill seconds saved``.
    The saving is the worker's :class:`~kvstore.connectors.router.PrefixScorer`
    score (longest consecutive cached prefix, from the event-built index: vLLM's
    GPU cache and the sidecar's tiers) with tier weights from the cost model
    (seconds a hit on that medium saves, relative to recompute: 1 on ``gpu``, the
    engine's own cache, whose hits are reused in place), and counts only when it is
    at least ``min_match`` of the request's prefill (default 0.5, like the
    ``cache_threshold`` of SGLang's cache-aware router); below it the request goes
    by load. Ties: fewest requests so far. Without the threshold a prefix every request shares (a
    system prompt: block 0 of every request of the conversation trace) pulls new
    sessions onto whichever worker cached it first whenever queues are short, so
    one worker's cache holds every session while the others sit empty.

A router sees workers only as :class:`Candidate` (pod name, requests so far,
outstanding work in seconds) and, for ``prefix``, the shared index.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from kvstore.connectors.router import PrefixIndex, PrefixScorer
from kvstore.policies.base import TierSpec
from kvstore.policies.cost import CostModel
from kvstore.replay.driver import MEDIA
from kvstore.replay.trace import Request
from kvstore.types import Medium

__all__ = ["DEFAULT_MIN_MATCH", "ENGINE_MEDIUM", "ROUTERS", "Candidate", "LoadRouter",
           "PrefixRouter", "RandomRouter", "Router", "make_router"]

ROUTERS = ("random", "load", "prefix")
#: The medium the index files vLLM's own GPU cache under (its events say ``GPU``).
ENGINE_MEDIUM = Medium.GPU.value.lower()
#: Share of a request's prefill its cached prefix must save to count (SGLang: cache_threshold).
DEFAULT_MIN_MATCH = 0.5


class Candidate(Protocol):
    @property
    def pod(self) -> str: ...

    @property
    def requests(self) -> int: ...

    def outstanding_s(self, now: float) -> float: ...


class Router(Protocol):
    def pick(self, req: Request, workers: Sequence[Candidate], now: float) -> int: ...


def _least_loaded(workers: Sequence[Candidate], candidates: Sequence[int], now: float) -> int:
    return min(candidates,
               key=lambda i: (workers[i].outstanding_s(now), workers[i].requests, i))


class RandomRouter:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def pick(self, req: Request, workers: Sequence[Candidate], now: float) -> int:
        return self._rng.randrange(len(workers))


class LoadRouter:
    def pick(self, req: Request, workers: Sequence[Candidate], now: float) -> int:
        return _least_loaded(workers, range(len(workers)), now)


class PrefixRouter:
    """Least ``outstanding work - prefill seconds its cached prefix saves`` (see above).

    The scorer's tier weights are the cost model's, so ``score * block_s`` is seconds;
    ``specs`` are a worker's sidecar tiers (the engine's cache, medium ``gpu``, weighs 1).
    """

    def __init__(self, index: PrefixIndex, cost: CostModel, specs: Sequence[TierSpec],
                 min_match: float = DEFAULT_MIN_MATCH) -> None:
        if not 0.0 <= min_match <= 1.0:
            raise ValueError(f"min_match must be in [0, 1], got {min_match}")
        self.block_s = cost.recompute_s(cost.block_tokens)
        weights = {ENGINE_MEDIUM: 1.0}
        weights.update({MEDIA[s.name].value.lower(): cost.saved_s(s) / self.block_s
                        for s in specs})
        self.scorer = PrefixScorer(index, weights)
        self.min_match = min_match

    def pick(self, req: Request, workers: Sequence[Candidate], now: float) -> int:
        scores = self.scorer.score(req.hash_ids, [w.pod for w in workers])
        floor = self.min_match * len(req.hash_ids)
        saved = [scores[w.pod] * self.block_s if scores[w.pod] >= floor else 0.0
                 for w in workers]
        return min(range(len(workers)), key=lambda i: (
            workers[i].outstanding_s(now) - saved[i], workers[i].requests, i))


def make_router(name: str, index: PrefixIndex, cost: CostModel, specs: Sequence[TierSpec],
                seed: int = 0, min_match: float = DEFAULT_MIN_MATCH) -> Router:
    """A router by name (one of :data:`ROUTERS`) over ``index``; ``specs``: a worker's tiers."""
    if name == "random":
        return RandomRouter(seed)
    if name == "load":
        return LoadRouter()
    if name == "prefix":
        return PrefixRouter(index, cost, specs, min_match)
    raise ValueError(f"unknown router {name!r}; valid: {', '.join(ROUTERS)}")


