"""The engine's config sections: ``[engine]``, ``[[quotas]]`` and ``[retention]``.

The engine's own schema, next to its code (loaded and composed by :mod:`kvstore.config`).
Quotas and retention both state bytes per tier (``dram`` / ``disk`` / ``redis``, 0 = not
set); :func:`tier_limits` reads them for both, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvstore.configtypes import size_field
from kvstore.errors import ConfigError

__all__ = ["LIMIT_TIERS", "EngineConfig", "QuotaConfig", "RetentionConfig", "tier_limits",
           "validate_quotas"]

#: The tiers a per-tenant byte limit (quota or retention) may be set for.
LIMIT_TIERS = ("dram", "disk", "redis")


def tier_limits(section: QuotaConfig | RetentionConfig) -> dict[str, int]:
    """Tier name -> byte limit, for the limits that are set (> 0)."""
    return {t: v for t in LIMIT_TIERS if (v := getattr(section, t)) > 0}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    #: Placement / eviction policy name (see ``kvstore.policies.available()``).
    policy: str = "adaptive"
    #: Copy every new block to the next slower tier in the background
    #: (write-back), so a DRAM eviction is a drop and a crash loses little.
    write_back: bool = True
    #: Prefill throughput of the served model (tokens/s) for the cost model.
    prefill_tokens_per_s: float = 10_000.0
    #: Longest HBM keep the policy may decide: how long a serving engine holds a
    #: finished request's blocks in its own KV cache for the session's next request
    #: (the vLLM connector asks at each lookup; its ``hold_max_ms`` and hold budget
    #: bound it on the engine's side). 0: never keep.
    hbm_keep_max_s: float = 10.0

    def validate(self) -> None:
        from kvstore import policies

        if self.policy not in policies.available():
            raise ConfigError(
                f"engine.policy: unknown policy {self.policy!r}; valid: "
                f"{', '.join(policies.available())}"
            )
        if self.prefill_tokens_per_s <= 0:
            raise ConfigError("engine.prefill_tokens_per_s: must be > 0")
        if not 0 <= self.hbm_keep_max_s <= 3600:
            raise ConfigError(
                f"engine.hbm_keep_max_s: must be in [0, 3600] seconds, got {self.hbm_keep_max_s!r}")


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """One tenant's byte limits per tier (a ``[[quotas]]`` table); 0 = no limit there.

    The tenant is every namespace starting with ``namespace_prefix`` (the longest
    matching prefix wins). Past its limit in a tier the tenant's own blocks there are
    evicted first; when none of them can go, its new block is not stored in that tier
    (a put spills into the next tier, or is cut at the last). Other tenants' blocks
    are never evicted for it. Limits count block payload bytes."""

    namespace_prefix: str = ""
    dram: int = size_field(0)
    disk: int = size_field(0)
    redis: int = size_field(0)

    def limits(self) -> dict[str, int]:
        """Tier name -> limit, for the limits that are set."""
        return tier_limits(self)


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """Retention (a client's ``cache_ttl_s`` / the Retain RPC): the longest TTL a client
    may ask for, and each tenant's retention quota per tier. A tenant is a
    ``[[quotas]]`` prefix, or else one namespace. ``dram`` / ``disk`` / ``redis``: the
    bytes a tenant may retain there; 0 = ``fraction`` of the tier's capacity."""

    max_ttl_s: float = 3600.0
    fraction: float = 0.5
    dram: int = size_field(0)
    disk: int = size_field(0)
    redis: int = size_field(0)

    def limits(self) -> dict[str, int]:
        """Tier name -> bytes a tenant may retain there, for the limits that are set."""
        return tier_limits(self)

    def validate(self) -> None:
        if not (isinstance(self.max_ttl_s, int | float) and 0 <= self.max_ttl_s <= 86_400 * 7):
            raise ConfigError(f"retention.max_ttl_s: must be in [0, 604800] seconds (0: no "
                              f"retention), got {self.max_ttl_s!r}")
        if not (isinstance(self.fraction, int | float) and 0 <= self.fraction <= 1):
            raise ConfigError(
                f"retention.fraction: must be in [0, 1] (a share of each tier's capacity), "
                f"got {self.fraction!r}")


def validate_quotas(quotas: Sequence[QuotaConfig], enabled: Mapping[str, bool]) -> None:
    """One table per non-empty prefix, at least one limit each, and only for tiers that
    are ``enabled`` (tier name -> whether its section enables it)."""
    seen: set[str] = set()
    for i, q in enumerate(quotas):
        what = f"quotas[{i}]"
        if not q.namespace_prefix:
            raise ConfigError(f"{what}.namespace_prefix: must be a non-empty string")
        if q.namespace_prefix in seen:
            raise ConfigError(f"{what}.namespace_prefix: {q.namespace_prefix!r} appears "
                              "twice; one table per prefix")
        seen.add(q.namespace_prefix)
        if not q.limits():
            raise ConfigError(f"{what}: set at least one of dram, disk, redis (bytes)")
        for tier in q.limits():
            if not enabled[tier]:
                raise ConfigError(f"{what}.{tier}: a limit for a tier that is not "
                                  f"enabled ({tier}.enabled = false)")
