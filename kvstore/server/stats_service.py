"""``Stats``: the engine's counters, and what each caller may see of them.

The servicer delegates to :func:`stats_response`. An admin (or any caller without
auth) sees the server's own counters, every quota and every retention; a tenant sees
only what its namespaces hold, and the quotas and retention of prefixes that are all
its own: the server's counters (lookups, bytes, events, sessions) count other tenants
too.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvstore import __version__
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.engine.core import Engine
from kvstore.security.grants import Tenant
from kvstore.server.convert import MEDIUM_TO_PB
from kvstore.server.looplag import LoopLag

__all__ = ["stats_response"]


def stats_response(engine: Engine, tenant: Tenant | None, events: Any = None,
                   loop_lag: LoopLag | None = None, window_s: float = 0.0
                   ) -> pb.StatsResponse:
    """The Stats answer for ``tenant`` (None: no auth); ``window_s``: the loop lag's
    window (out of range: 10 s)."""
    if tenant is not None and "admin" not in tenant.rights:
        return _tenant_stats(engine, tenant)
    eng = engine
    st = eng.stats
    tiers = [
        pb.TierStats(
            name=name, medium=MEDIUM_TO_PB[t.medium], capacity_bytes=t.capacity_bytes,
            used_bytes=t.used_bytes,
            blocks=eng.index.tier_blocks[name],
            hits=st.tier_hits[name], evictions=st.evictions[name],
        )
        for name, t in eng.tiers.items()
    ]
    return pb.StatsResponse(
        tiers=tiers, blocks=len(eng.index), namespaces=len(eng.index.namespaces()),
        lookups=st.lookups, lookup_hit_blocks=st.lookup_hit_blocks,
        lookup_miss_blocks=st.lookup_miss_blocks, puts=st.puts, gets=st.gets,
        bytes_in=st.bytes_in, bytes_out=st.bytes_out, pending_moves=eng.mover.pending,
        version=__version__, sessions=len(eng.sessions),
        events_published=getattr(events, "published", 0) if events else 0,
        transfers_failed=eng.mover.failed, transfers_dropped=eng.mover.dropped,
        events_dropped=getattr(events, "dropped", 0) if events else 0,
        corrupt_reads=st.corrupt_reads, orphans_dropped=st.orphans_dropped,
        demotions_failed=st.demotions_failed, startup_skipped=eng.startup_skipped(),
        quarantined_slots=eng.leases.quarantined, policy=eng.policy.name,
        quotas=_quota_stats(eng, tenant), retention=_retention_stats(eng, tenant),
        retained_granted=eng.retention.granted, retained_refused=eng.retention.refused,
        retained_returned=eng.retention.returned, retained_evicted=eng.retention.evicted,
        loop_lag=_loop_lag(loop_lag, window_s),
    )


def _tenant_stats(eng: Engine, tenant: Tenant) -> pb.StatsResponse:
    """What the tenant's namespaces hold, and nothing of the server's own counters."""
    blocks: Counter[str] = Counter()
    used: Counter[str] = Counter()
    total = 0
    spaces = [ns for ns in eng.index.namespaces() if tenant.covers(ns)]
    for ns in spaces:
        for entry in eng.index.blocks_of(ns).values():
            total += 1
            for tier in entry.tiers:
                blocks[tier] += 1
                used[tier] += entry.meta.size
    tiers = [pb.TierStats(name=name, medium=MEDIUM_TO_PB[t.medium],
                          capacity_bytes=t.capacity_bytes, used_bytes=used[name],
                          blocks=blocks[name])
             for name, t in eng.tiers.items()]
    return pb.StatsResponse(tiers=tiers, blocks=total, namespaces=len(spaces),
                            version=__version__, policy=eng.policy.name,
                            quotas=_quota_stats(eng, tenant),
                            retention=_retention_stats(eng, tenant))


def _quota_stats(eng: Engine, tenant: Tenant | None) -> list[pb.QuotaStats]:
    """Quota usage: every quota for an admin (or without auth); for a tenant, the
    quotas on prefixes all of whose namespaces are its own."""
    return [pb.QuotaStats(namespace_prefix=u.prefix, tier=u.tier, limit_bytes=u.limit_bytes,
                          used_bytes=u.used_bytes, evictions=u.evictions, refused=u.refused)
            for u in eng.quotas.usage()
            if tenant is None or "admin" in tenant.rights or tenant.covers_prefix(u.prefix)]


def _retention_stats(eng: Engine, tenant: Tenant | None) -> list[pb.RetentionStats]:
    """Retained bytes per (tenant, tier): all for an admin (or without auth); for a
    tenant, those of its own namespaces or quota prefixes."""
    return [pb.RetentionStats(tenant=u.tenant, tier=u.tier, retained_bytes=u.retained_bytes,
                              limit_bytes=u.limit_bytes)
            for u in eng.retention.usage(eng.index, eng.clock())
            if tenant is None or "admin" in tenant.rights or tenant.covers(u.tenant)
            or tenant.covers_prefix(u.tenant)]


def _loop_lag(loop_lag: LoopLag | None, window_s: float) -> pb.LoopLag | None:
    if loop_lag is None:
        return None
    if not 0 < window_s < 1e6:
        window_s = 10.0
    lag = loop_lag.summary(window_s)
    busy = loop_lag.busy_summary(window_s)
    return pb.LoopLag(samples=lag.samples, p50_ms=lag.p50_ms, p99_ms=lag.p99_ms,
                      max_ms=lag.max_ms, busy_samples=busy.samples,
                      busy_p50_ms=busy.p50_ms, busy_p99_ms=busy.p99_ms,
                      busy_max_ms=busy.max_ms)
