"""Scorer: longest consecutive cached prefix per pod, weighted by tier.

A pod scores, for each block of the request's prefix that it holds *without
a gap from block 0*, the weight of the best medium it holds that block on;
counting stops at the first block it lacks (the engine can only reuse a
consecutive prefix). Medium names are matched lower-cased and unknown media
weigh ``1.0``, as in llm-d's ``LongestPrefixScorer``.

Default weights (``DEFAULT_WEIGHTS``), from the cost of getting a cached block
back into HBM relative to recomputing it (DESIGN.md section 1: a slow-tier hit
can lose to recompute):

========  ======  ==========================================================
medium    weight  why
========  ======  ==========================================================
gpu       1.0     reused in place, free
cpu       0.8     one host-to-device copy (PCIe/NVLink, tens of GB/s)
disk      0.5     NVMe read plus the copy; long prefixes still win clearly
remote    0.3     network fetch (Redis); worth it for long prefixes only
========  ======  ==========================================================

vLLM 0.33's ``STORAGE`` reaches the scorer as ``disk`` (``LOCAL``) or ``remote``
(``REMOTE``): the index names media by tier (:mod:`.index`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kvstore.events.wire import ExternalBlockHash, HashFormat, external_hash
from kvstore.hashing import PrefixHasher

from .index import PrefixIndex

__all__ = ["DEFAULT_WEIGHTS", "PrefixScorer", "request_block_hashes"]

DEFAULT_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8, "disk": 0.5, "remote": 0.3}


def request_block_hashes(
    token_ids: Sequence[int],
    hasher: PrefixHasher,
    hash_format: HashFormat = "int",
    **kwargs: object,
) -> list[ExternalBlockHash]:
    """The request's full-block hashes in the form events carry."""
    return [external_hash(h, hash_format) for h in hasher.iter_hashes(token_ids, **kwargs)]  # type: ignore[arg-type]


class PrefixScorer:
    def __init__(
        self,
        index: PrefixIndex,
        weights: Mapping[str, float] = DEFAULT_WEIGHTS,
        unknown_weight: float = 1.0,
    ) -> None:
        self.index = index
        self.weights = {k.lower(): float(v) for k, v in weights.items()}
        self.unknown_weight = unknown_weight

    def _weight(self, media: Iterable[str]) -> float:
        return max(self.weights.get(m, self.unknown_weight) for m in media)

    def score(
        self, block_hashes: Sequence[ExternalBlockHash], pods: Iterable[str] | None = None
    ) -> dict[str, float]:
        """``{pod: score}`` for every candidate pod (0.0 when it holds no prefix)."""
        candidates = set(pods) if pods is not None else None
        scores: dict[str, float] = dict.fromkeys(candidates or (), 0.0)
        active: set[str] | None = None
        for h in block_hashes:
            holders = self.index.holders(h)
            live = set(holders) if active is None else active & holders.keys()
            if candidates is not None:
                live &= candidates
            if not live:
                break
            for pod in live:
                scores[pod] = scores.get(pod, 0.0) + self._weight(holders[pod])
            active = live
        return scores

    def prefix_blocks(self, block_hashes: Sequence[ExternalBlockHash], pod: str) -> int:
        """How many leading blocks ``pod`` holds (on any tier)."""
        n = 0
        for h in block_hashes:
            if pod not in self.index.holders(h):
                break
            n += 1
        return n

    def best(
        self, block_hashes: Sequence[ExternalBlockHash], pods: Iterable[str]
    ) -> tuple[str, float]:
        """The best-scoring pod among ``pods`` (first listed wins ties)."""
        order = list(pods)
        if not order:
            raise ValueError("best() needs at least one candidate pod")
        scores = self.score(block_hashes, order)
        pod = max(order, key=lambda p: scores.get(p, 0.0))
        return pod, scores.get(pod, 0.0)
