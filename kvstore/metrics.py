"""Prometheus metrics, read from the engine at scrape time.

A collector wraps the engine from the outside (nothing inside the engine knows
about Prometheus): per-tier bytes, blocks, hits, evictions; lookup hits and
misses; bytes in/out; bytes moved between tiers; events published. Transfer
latency comes from :class:`TimedTier`, a decorator around any tier. The live
workload profile's headline numbers come from
:class:`kvstore.profile.prom.ProfileCollector`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvstore.tiers.base import CountingTier, Tier
from kvstore.types import BlockKey, BlockMeta

if TYPE_CHECKING:
    from kvstore.engine.core import Engine
    from kvstore.profile.live import LiveProfile

__all__ = ["EngineCollector", "TimedTier", "make_registry"]

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class EngineCollector(Collector):
    def __init__(self, engine: Engine, events: Any = None) -> None:
        self.engine = engine
        self.events = events

    def collect(self) -> Iterator[Any]:
        eng = self.engine
        st = eng.stats
        used = GaugeMetricFamily("kvstore_tier_used_bytes", "Payload bytes stored", labels=["tier"])
        cap = GaugeMetricFamily("kvstore_tier_capacity_bytes", "Tier capacity", labels=["tier"])
        blocks = GaugeMetricFamily("kvstore_tier_blocks", "Blocks stored", labels=["tier"])
        hits = CounterMetricFamily("kvstore_tier_hits", "Lookup hits served", labels=["tier"])
        ev = CounterMetricFamily("kvstore_tier_evictions", "Evictions", labels=["tier"])
        per_tier = eng.index.tier_blocks
        for name, tier in eng.tiers.items():
            used.add_metric([name], tier.used_bytes)
            cap.add_metric([name], tier.capacity_bytes)
            blocks.add_metric([name], per_tier[name])
            hits.add_metric([name], st.tier_hits[name])
            ev.add_metric([name], st.evictions[name])
        yield from (used, cap, blocks, hits, ev)
        yield self._tier_ops()
        yield CounterMetricFamily("kvstore_lookup_hit_blocks", "Blocks found by lookups",
                                  value=st.lookup_hit_blocks)
        yield CounterMetricFamily("kvstore_lookup_miss_blocks", "Blocks missed by lookups",
                                  value=st.lookup_miss_blocks)
        yield CounterMetricFamily("kvstore_bytes_in", "Payload bytes stored by clients",
                                  value=st.bytes_in)
        yield CounterMetricFamily("kvstore_bytes_out", "Payload bytes served to clients",
                                  value=st.bytes_out)
        moved = CounterMetricFamily("kvstore_transfer_bytes", "Bytes moved between tiers",
                                    labels=["src", "dst"])
        for (src, dst), n in st.moved_bytes.items():
            moved.add_metric([src, dst], n)
        yield moved
        yield GaugeMetricFamily("kvstore_pending_transfers", "Queued mover transfers",
                                value=eng.mover.pending)
        yield CounterMetricFamily("kvstore_events_published", "Block events published",
                                  value=getattr(self.events, "published", 0))
        yield CounterMetricFamily("kvstore_events_dropped",
                                  "Event batches lost (publisher high-water mark, failures, "
                                  "lagging subscribers)", value=getattr(self.events, "dropped", 0))
        yield CounterMetricFamily("kvstore_transfers_failed",
                                  "Tier-to-tier transfers that failed or were skipped",
                                  value=eng.mover.failed)
        yield CounterMetricFamily("kvstore_transfers_dropped",
                                  "Transfers refused because the mover queue was full",
                                  value=eng.mover.dropped)
        yield CounterMetricFamily("kvstore_corrupt_reads",
                                  "Copies found corrupt on read and dropped",
                                  value=st.corrupt_reads)
        yield from self._failed_copies()
        yield CounterMetricFamily("kvstore_orphans_dropped",
                                  "Recovered blocks dropped at start (an ancestor was gone)",
                                  value=st.orphans_dropped)
        yield GaugeMetricFamily("kvstore_startup_skipped",
                                "Entries the persistent tiers could not use at start",
                                value=eng.startup_skipped())
        yield GaugeMetricFamily("kvstore_quarantined_slots",
                                "Slots of expired reservations not yet reusable",
                                value=eng.leases.quarantined)
        yield from self._quotas()
        yield from self._retention()

    def _quotas(self) -> Iterator[Any]:
        """Per-tenant quotas (``[[quotas]]``): nothing when none is configured."""
        labels = ["prefix", "tier"]
        limit = GaugeMetricFamily("kvstore_quota_limit_bytes", "A tenant's byte limit in a tier",
                                  labels=labels)
        used = GaugeMetricFamily("kvstore_quota_used_bytes",
                                 "Payload bytes of a tenant's blocks in a tier", labels=labels)
        ev = CounterMetricFamily("kvstore_quota_evictions",
                                 "A tenant's own blocks evicted to keep it within its quota",
                                 labels=labels)
        refused = CounterMetricFamily("kvstore_quota_refused",
                                      "Blocks not stored in a tier: the tenant was at its quota",
                                      labels=labels)
        for u in self.engine.quotas.usage():
            limit.add_metric([u.prefix, u.tier], u.limit_bytes)
            used.add_metric([u.prefix, u.tier], u.used_bytes)
            ev.add_metric([u.prefix, u.tier], u.evictions)
            refused.add_metric([u.prefix, u.tier], u.refused)
        yield from (limit, used, ev, refused)

    def _retention(self) -> Iterator[Any]:
        """Retention (cache_ttl_s / Retain): bytes per (tenant, tier) and its counters."""
        eng = self.engine
        ret = eng.retention
        held = GaugeMetricFamily("kvstore_retained_bytes",
                                 "Bytes of a tenant's retained blocks in a tier",
                                 labels=["tenant", "tier"])
        for u in ret.usage(eng.index, eng.clock()):
            held.add_metric([u.tenant, u.tier], u.retained_bytes)
        yield held
        for name, value, doc in (
                ("granted", ret.granted, "Blocks a retain protected"),
                ("refused", ret.refused, "Blocks a retain could not protect (retention quota)"),
                ("returned", ret.returned, "Lookup hits on blocks while they were retained"),
                ("evicted", ret.evicted, "Retained blocks evicted (demoted) before their TTL")):
            c = CounterMetricFamily(f"kvstore_retained_{name}", doc)
            c.add_metric([], value)
            yield c


    def _failed_copies(self) -> Iterator[Any]:
        """Failed copies between tiers by (src, dst, cause), demotions apart (their
        victims were dropped); and the tiers whose writes keep failing (degraded)."""
        health = self.engine.health
        labels = ["src", "dst", "cause"]
        demotions = CounterMetricFamily(
            "kvstore_demotions_failed",
            "Victims dropped because their copy to the next tier failed", labels=labels)
        copies = CounterMetricFamily(
            "kvstore_copies_failed",
            "Copies between tiers that failed (demotions, write-backs, recovery point, "
            "drain, prefetches)", labels=labels)
        for (src, dst, cause), n in sorted(health.failed.items()):
            copies.add_metric([src, dst, cause], n)
        for (src, dst, cause), n in sorted(health.demotions.items()):
            demotions.add_metric([src, dst, cause], n)
        degraded = GaugeMetricFamily(
            "kvstore_tier_degraded",
            "1 while a tier's last writes all failed (the KVStore health is NOT_SERVING)",
            labels=["tier"])
        bad = set(health.degraded())
        for name in self.engine.tiers:
            degraded.add_metric([name], 1.0 if name in bad else 0.0)
        yield from (demotions, copies, degraded)

    def _tier_ops(self) -> CounterMetricFamily:
        """What tiers absorbed without telling the engine (``CountingTier``): e.g. the
        redis tier's misses, timeouts, unavailable / oom / corrupt values, probes."""
        fam = CounterMetricFamily("kvstore_tier_ops", "Tier operation outcomes",
                                  labels=["tier", "outcome"])
        for name, tier in self.engine.tiers.items():
            inner = tier.unwrap()
            if isinstance(inner, CountingTier):
                for outcome, n in sorted(inner.counters().items()):
                    fam.add_metric([name, outcome], n)
        return fam


def make_registry(engine: Engine, events: Any = None, profile: LiveProfile | None = None
                  ) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine, events))
    registry.register(TimedTier.LATENCY)
    if profile is not None:
        from kvstore.profile.prom import ProfileCollector

        registry.register(ProfileCollector(profile))
    return registry


class TimedTier(Tier):
    """Decorator: records put/get latency per tier; forwards everything else."""

    LATENCY = Histogram("kvstore_tier_op_seconds", "Tier operation latency",
                        ["tier", "op"], buckets=_BUCKETS, registry=None)

    def __init__(self, inner: Tier) -> None:
        self.inner = inner
        self.name = inner.name
        self.medium = inner.medium

    def unwrap(self) -> Tier:
        return self.inner.unwrap()

    @property
    def capacity_bytes(self) -> int:
        return self.inner.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self.inner.used_bytes

    def can_fit(self, size: int) -> bool:
        return self.inner.can_fit(size)

    async def put(self, meta: BlockMeta, payload: bytes | memoryview) -> None:
        t0 = time.perf_counter()
        await self.inner.put(meta, payload)
        self.LATENCY.labels(self.name, "put").observe(time.perf_counter() - t0)

    async def get(self, key: BlockKey) -> bytes | memoryview:
        t0 = time.perf_counter()
        out = await self.inner.get(key)
        self.LATENCY.labels(self.name, "get").observe(time.perf_counter() - t0)
        return out

    async def contains(self, key: BlockKey) -> bool:
        return await self.inner.contains(key)

    async def delete(self, key: BlockKey) -> bool:
        return await self.inner.delete(key)

    async def close(self) -> None:
        await self.inner.close()

    async def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | memoryview]:
        return [await self.get(k) for k in keys]
