"""A reuse-count admission filter that wraps any policy.

vLLM's ``store_threshold`` and Dynamo's "frequency >= 2": a block is only
admitted once its key has been looked up ``threshold`` times. The filter changes
one decision, the admission plan, so that is the one method it has
(:class:`~kvstore.policies.base.Wrapper` passes everything else to the wrapped
policy unchanged). Counts are kept for at most ``max_tracked`` keys (oldest
forgotten first), so memory stays bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Self

from kvstore.policies.base import Plan, Policy, PolicyConfig, RequestInfo, Wrapper
from kvstore.policies.lru import LRUPolicy
from kvstore.policies.s3fifo import S3FIFOPolicy


class AdmissionFilter(Wrapper):
    """Decorator: admit a block only after ``threshold`` lookups of its key."""

    name = "filter"

    def __init__(self, inner: Policy, threshold: int = 2, max_tracked: int = 1 << 20) -> None:
        super().__init__(inner)
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        if max_tracked < 1:
            raise ValueError(f"max_tracked must be >= 1, got {max_tracked}")
        self.threshold = threshold
        self._max_tracked = max_tracked
        self._seen: OrderedDict[Hashable, int] = OrderedDict()

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        """Around LRU (the subclasses name another inner policy)."""
        return cls(LRUPolicy(config.tiers), **options)

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


class FilteredLRU(AdmissionFilter):
    name = "lru+filter"


class FilteredS3FIFO(AdmissionFilter):
    name = "s3fifo+filter"

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        return cls(S3FIFOPolicy(config.tiers), **options)
