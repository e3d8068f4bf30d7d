"""Per-tenant byte quotas per tier: accounting and the question "how much must go".

A tenant is a namespace prefix (``"tenant-a/"``); a namespace belongs to the quota
with the longest prefix it starts with, or to none. Usage is the payload bytes of the
tenant's blocks the index holds in a tier, kept as locations change (the index calls
:meth:`Quotas.charge`). The engine enforces a quota where it makes room
(:meth:`kvstore.engine.placement.Placement.make_room`): a tenant past its limit in a
tier gives up its own blocks there (the policy picks them, with every other tenant's
blocks protected) or, when none of its own can go, the block is refused in that tier
(a put spills into the next tier). No quota configured: nothing is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kvstore.types import BlockKey

__all__ = ["OtherTenants", "Quota", "QuotaUsage", "Quotas"]

_CACHE_LIMIT = 1 << 16


@dataclass(frozen=True, slots=True)
class Quota:
    """Byte limits of the namespaces starting with ``prefix``, per tier name."""

    prefix: str
    limits: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    """One (quota, tier) as Stats and /metrics report it."""

    prefix: str
    tier: str
    limit_bytes: int
    used_bytes: int
    evictions: int
    refused: int


class Quotas:
    """The configured quotas, the bytes each tenant holds per tier, and counters."""

    def __init__(self, quotas: Sequence[Quota] = ()) -> None:
        prefixes = [q.prefix for q in quotas]
        if len(set(prefixes)) != len(prefixes) or not all(prefixes):
            raise ValueError(f"quota prefixes must be unique and non-empty: {prefixes!r}")
        # longest prefix first: the first match is the most specific
        self._quotas = sorted(quotas, key=lambda q: len(q.prefix), reverse=True)
        self._of: dict[str, Quota | None] = {}
        self._used: Counter[tuple[str, str]] = Counter()
        #: (prefix, tier) -> blocks evicted to keep the tenant within its limit
        self.evictions: Counter[tuple[str, str]] = Counter()
        #: (prefix, tier) -> blocks refused in the tier (none of the tenant's own could go)
        self.refused: Counter[tuple[str, str]] = Counter()

    def __bool__(self) -> bool:
        return bool(self._quotas)

    def quota_of(self, namespace: str) -> Quota | None:
        try:
            return self._of[namespace]
        except KeyError:
            pass
        found = next((q for q in self._quotas if namespace.startswith(q.prefix)), None)
        if len(self._of) >= _CACHE_LIMIT:
            self._of.clear()
        self._of[namespace] = found
        return found

    def charge(self, namespace: str, tier: str, delta: int) -> None:
        """The index stored (``delta > 0``) or dropped a block of ``namespace`` in ``tier``."""
        if self._quotas and (q := self.quota_of(namespace)) is not None:
            self._used[(q.prefix, tier)] += delta

    def used(self, quota: Quota, tier: str) -> int:
        return self._used[(quota.prefix, tier)]

    def limit(self, namespace: str, tier: str) -> tuple[Quota, int] | None:
        """The quota ``namespace`` is under in ``tier`` and its limit, if it has one."""
        if not self._quotas:
            return None
        q = self.quota_of(namespace)
        if q is None:
            return None
        lim = q.limits.get(tier, 0)
        return (q, lim) if lim > 0 else None

    def excess(self, namespace: str, tier: str, size: int) -> int:
        """Bytes ``namespace``'s tenant must free in ``tier`` before ``size`` more fit
        (0: they fit, or no quota applies)."""
        found = self.limit(namespace, tier)
        if found is None:
            return 0
        q, lim = found
        return max(self._used[(q.prefix, tier)] + size - lim, 0)

    def usage(self) -> Iterator[QuotaUsage]:
        for q in sorted(self._quotas, key=lambda q: q.prefix):
            for tier, lim in sorted(q.limits.items()):
                if lim > 0:
                    k = (q.prefix, tier)
                    yield QuotaUsage(q.prefix, tier, lim, self._used[k], self.evictions[k],
                                     self.refused[k])


class OtherTenants(Container[Hashable]):
    """What a quota eviction may not take: ``base`` (pinned, in flight, the request's
    own blocks) and every block of another tenant (or of no tenant)."""

    __slots__ = ("_base", "_quota", "_quotas")

    def __init__(self, base: Container[Hashable], quotas: Quotas, quota: Quota) -> None:
        self._base = base
        self._quotas = quotas
        self._quota = quota

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, BlockKey):
            return True
        return self._quotas.quota_of(key.namespace) is not self._quota or key in self._base
