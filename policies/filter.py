"""A reuse-count admission filter that wraps any policy.

vLLM's ``store_threshold`` and Dynamo's "frequency >= 2": a block is only
admitted once its key has been looked up ``threshold`` times. Everything else
is forwarded to the wrapped policy unchanged. Counts are kept for at most
``max_tracked`` keys (oldest forgotten first), so memory stays bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Sequence

from kvstore.policies.base import BlockInfo, Hint, Move, Plan, Policy, RequestInfo, TierSpec
from kvstore.policies.lru import LRUPolicy
from kvstore.policies.s3fifo import S3FIFOPolicy


class AdmissionFilter(Policy):
    """Decorator: admit a block only after ``threshold`` lookups of its key."""

    name = "filter"

    def __init__(self, tiers: Sequence[TierSpec], inner: Policy | None = None,
                 threshold: int = 2, max_tracked: int = 1 << 20) -> None:
        super().__init__(tiers)
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        if max_tracked < 1:
            raise ValueError(f"max_tracked must be >= 1, got {max_tracked}")
        self.inner: Policy = inner if inner is not None else LRUPolicy(tiers)
        self.threshold = threshold
        self._max_tracked = max_tracked
        self._seen: OrderedDict[Hashable, int] = OrderedDict()

    def count(self, key: Hashable) -> int:
        return self._seen.get(key, 0)

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        seen = self._seen
        for key in req.keys:
            seen[key] = seen.get(key, 0) + 1
            seen.move_to_end(key)
        while len(seen) > self._max_tracked:
            seen.popitem(last=False)
        plan = self.inner.on_request(req, now)
        admit = {k: t for k, t in plan.admit.items() if seen.get(k, 0) >= self.threshold}
        return Plan(admit, plan.moves)

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        return self.inner.demote_to(key, tier, now)

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        return self.inner.on_hint(hint, keys, now)

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self.inner.on_insert(info, tier, now)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        self.inner.on_access(key, tier, now)

    def on_remove(self, key: Hashable, tier: str) -> None:
        self.inner.on_remove(key, tier)

    def evict(
        self, tier: str, nbytes: int, protected: Container[Hashable], now: float
    ) -> list[Hashable] | None:
        return self.inner.evict(tier, nbytes, protected, now)


class FilteredLRU(AdmissionFilter):
    name = "lru+filter"

    def __init__(self, tiers: Sequence[TierSpec], threshold: int = 2) -> None:
        super().__init__(tiers, LRUPolicy(tiers), threshold)


class FilteredS3FIFO(AdmissionFilter):
    name = "s3fifo+filter"

    def __init__(self, tiers: Sequence[TierSpec], threshold: int = 2) -> None:
        super().__init__(tiers, S3FIFOPolicy(tiers), threshold)
