"""Server assembly and lifecycle: config -> tiers -> policy -> engine -> gRPC.

``await server.start()``, ``await server.wait_for_termination()``,
``await server.stop(grace)`` in ``finally``; components close in reverse order
of start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kvstore import policies
from kvstore._proto.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from kvstore.config import Config, build_section
from kvstore.engine.core import Engine, tier_specs
from kvstore.engine.quotas import Quota
from kvstore.engine.retention import RetentionLimits
from kvstore.errors import ConfigError
from kvstore.metrics import TimedTier, make_registry
from kvstore.policies.cost import CostModel
from kvstore.profile.live import LiveProfile
from kvstore.security.server import ServerSecurity
from kvstore.server.looplag import LoopLag
from kvstore.server.servicer import KVStoreServicer
from kvstore.tiers.base import Tier

__all__ = ["KVStoreServer", "build_tiers", "run_served"]

T = TypeVar("T")

log = logging.getLogger(__name__)

SERVICE_NAME = kvstore_pb2.DESCRIPTOR.services_by_name["KVStore"].full_name
#: How often the sweeper runs (leases, reservations, the recovery point, health).
SWEEP_S = 0.5

def run_served(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on the event loop ``kvstore serve`` serves on (uvloop where it is
    installed), so what times the server in process runs on the same loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - non-Linux
        return asyncio.run(main)
    return uvloop.run(main)


def build_tiers(cfg: Config) -> list[Tier]:
    tiers: list[Tier] = []
    if cfg.dram.enabled:
        from kvstore.tiers.dram import DramTier
        from kvstore.tiers.shmowner import reap_stale_segments

        # Dead servers' segments: this data_dir's predecessor's (DramTier, whatever its
        # pid) and any whose owner no longer holds its flock (here).
        reap_stale_segments(cfg.dram.segment_prefix)
        tiers.append(DramTier(cfg.dram.capacity, name="dram",
                              segment_prefix=cfg.dram.segment_prefix,
                              owner_dir=Path(cfg.data_dir), mode=cfg.dram.mode,
                              gid=cfg.dram.gid()))
    if cfg.disk.enabled:
        from kvstore.tiers.disk import DiskTier

        tiers.append(DiskTier(cfg.disk_path, cfg.disk.capacity, name="disk",
                              segment_bytes=cfg.disk.segment_size,
                              direct_io=cfg.disk.direct_io))
    if cfg.redis.enabled:  # shared between hosts: the last stop before a drop
        from kvstore.tiers.redis import RedisTier

        tiers.append(RedisTier(cfg.redis, name="redis"))
    return tiers


def _events_config(cfg: Config) -> Any:
    from kvstore.events import EventsConfig

    return build_section("events", EventsConfig, cfg.events)


class KVStoreServer:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.events: Any = None
        self.ingest: Any = None
        self.vllm_cache: Any = None
        self.engine: Engine | None = None
        #: The live workload profile the servicer feeds (``kvstore profile --server``).
        self.profile = LiveProfile()
        self._grpc: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        #: The servicer the gRPC server runs (``kvstore bench-loop`` times its handlers).
        self.servicer: KVStoreServicer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        #: The event loop's lag, sampled while serving (the Stats RPC reports it).
        self.loop_lag = LoopLag()
        self._lag_task: asyncio.Task[None] | None = None
        #: Tiers the engine reported degraded at the last sweep (see ``_check_health``).
        self.degraded: list[str] = []
        self._metrics_server: Any = None
        self.port: int = 0
        self.metrics_port: int = 0
        self.recovered = 0

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop(0)
            raise

    async def _start(self) -> None:
        cfg = self.cfg
        # Before anything starts: an exposed port without credentials is refused at once.
        security = ServerSecurity.from_config(cfg)
        security.check_exposure(cfg.server.listen)
        from kvstore.tiers.disk.segment import make_private_dir

        make_private_dir(Path(cfg.data_dir))
        from kvstore.events import VllmCacheMirror, build_bus, build_ingest
        from kvstore.events.config import DEFAULT_MODEL

        events_cfg = _events_config(cfg)
        if events_cfg.enabled and not events_cfg.topic and events_cfg.model == DEFAULT_MODEL:
            log.warning("events.model is not set: topics read %s; set it to the served "
                        "model name so routers match this pod's events to requests",
                        events_cfg.effective_topic)
        # With [events] enabled = false nothing goes out over ZMQ; gRPC SubscribeEvents
        # still works.
        self.events = build_bus(events_cfg)
        await self.events.start()
        # The worker's own vLLM events: mirrored (what sits in the engine's GPU cache)
        # and re-published with ours, so routers see one complete stream.
        self.vllm_cache = VllmCacheMirror()
        bus = self.events
        self.ingest = build_ingest(
            events_cfg, lambda evs: bus.publish_events(self.vllm_cache.apply(evs)))
        if self.ingest is not None:
            await self.ingest.start()
        tiers: list[Tier] = []
        try:
            for t in build_tiers(cfg):
                tiers.append(TimedTier(t))
        except BaseException:
            for t in tiers:
                await t.close()
            raise
        # The cost model: the served model's prefill speed from config, the tiers'
        # bandwidths from the table the replay uses too, block sizes measured per
        # namespace from what is stored.
        cost = CostModel(prefill_tokens_per_s=cfg.engine.prefill_tokens_per_s)
        bandwidth = {"redis": cfg.redis.read_bytes_per_s}
        policy = policies.create(cfg.engine.policy, tier_specs(tiers, bandwidth), cost=cost,
                                 hbm_keep_max_s=cfg.engine.hbm_keep_max_s)
        srv = cfg.server
        self.engine = Engine(
            tiers, policy, self.events, cost=cost, bandwidth=bandwidth,
            lease_seconds=srv.lease_seconds,
            max_block_bytes=srv.max_block_bytes, write_back=cfg.engine.write_back,
            max_hashes=srv.max_hashes_per_call, max_block_tokens=srv.max_block_tokens,
            max_lease_seconds=srv.max_lease_seconds,
            max_pinned_fraction=cfg.dram.max_pinned_fraction,
            quotas=[Quota(q.namespace_prefix, q.limits()) for q in cfg.quotas],
            # queued at the first sweep at most max_write_delay_s after the put
            max_write_delay_s=max(0.0, cfg.disk.max_write_delay_s - SWEEP_S),
            retention=RetentionLimits(cfg.retention.max_ttl_s, cfg.retention.limits(),
                                      cfg.retention.fraction))
        if cfg.redis.enabled:
            from kvstore.engine.shared import SharedPrefix

            self.engine.shared = SharedPrefix(self.engine, "redis",
                                              write_through=cfg.redis.write_through)
        self.recovered = await self.engine.start()

        opts = [
            ("grpc.max_receive_message_length", cfg.server.max_message_bytes),
            ("grpc.max_send_message_length", cfg.server.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(options=opts, maximum_concurrent_rpcs=srv.max_concurrent_rpcs,
                                 interceptors=security.interceptors())
        self.servicer = KVStoreServicer(self.engine, self.events, self.profile,
                                        max_put_streams=srv.max_put_streams,
                                        loop_lag=self.loop_lag)
        kvstore_pb2_grpc.add_KVStoreServicer_to_server(self.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, reflection.SERVICE_NAME, health.SERVICE_NAME), server)
        try:
            self.port = security.add_port(server, cfg.server.listen)
        except RuntimeError as exc:
            self.port = 0
            cause: Exception | None = exc
        else:
            cause = None
        if self.port == 0:
            raise ConfigError(
                f"server.listen: cannot bind {cfg.server.listen!r} (address in use, or not "
                "an address of this host)") from cause
        await server.start()
        self._grpc = server
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="sweeper")
        self._lag_task = asyncio.get_running_loop().create_task(self.loop_lag.run(),
                                                                name="loop-lag")
        if cfg.server.metrics_port:
            self._start_metrics()
        log.info("kvstore serving on %s (port %d, %s, %d tenants), tiers %s, policy %s, "
                 "%d blocks recovered", cfg.server.listen, self.port,
                 "mutual TLS" if security.mutual_tls else "TLS" if cfg.tls.enabled
                 else "plaintext", len(security.table.tenants), [t.name for t in tiers],
                 cfg.engine.policy, self.recovered)

    def _start_metrics(self) -> None:
        from prometheus_client import start_http_server

        assert self.engine is not None
        host = self.cfg.server.listen.rpartition(":")[0].strip("[]")
        try:
            server, _thread = start_http_server(
                self.cfg.server.metrics_port, addr=host,
                registry=make_registry(self.engine, self.events, self.profile))
        except OSError as exc:
            log.warning("metrics port %d unavailable, /metrics disabled: %s",
                        self.cfg.server.metrics_port, exc)
            return
        self._metrics_server = server
        self.metrics_port = server.server_port

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            if self.engine is not None:
                try:
                    await self.engine.sweep()
                    await self._check_health()
                except Exception:  # the sweeper must outlive any one failure
                    log.exception("sweep failed")

    async def _check_health(self) -> None:
        """The KVStore service's health: NOT_SERVING while a tier is degraded (its
        last writes all failed: ``WriteHealth``), SERVING again once none is. The
        overall status (service ``""``, what probes without a service name ask)
        stays SERVING: the process serves, and a failing cache disk should neither
        restart the sidecar nor take its worker out of service."""
        assert self.engine is not None
        degraded = self.engine.health.degraded()
        if degraded == self.degraded or not self.engine.accepting:
            return
        if degraded:
            log.error("tiers %s degraded (their last %d writes failed): health of %s is "
                      "NOT_SERVING until a write succeeds", degraded,
                      self.engine.health.threshold, SERVICE_NAME)
        else:
            log.warning("tiers %s write again: health of %s is SERVING", self.degraded,
                        SERVICE_NAME)
        self.degraded = degraded
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING
                               if degraded else health_pb2.HealthCheckResponse.SERVING)

    async def wait_for_termination(self) -> None:
        if self._grpc is not None:
            await self._grpc.wait_for_termination()

    async def stop(self, grace: float | None = None) -> None:
        """Drain (a started server: refuse puts, write DRAM back to disk for up to
        ``server.drain_timeout_s`` less ``grace``; reads are still served), then give
        in-flight calls ``grace`` seconds and close everything."""
        grace = self.cfg.server.grace_seconds if grace is None else grace
        deadline = time.monotonic() + self.cfg.server.drain_timeout_s
        await self._health.enter_graceful_shutdown()
        if self.engine is not None and self._grpc is not None:
            await self.engine.drain(max(0.0, deadline - time.monotonic() - grace))
        if self._grpc is not None:
            await self._grpc.stop(grace)
            self._grpc = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._lag_task is not None:
            self._lag_task.cancel()
            self._lag_task = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        if self.engine is not None:  # what the mover still has queued, in the time left
            await self.engine.close(max(0.0, deadline - time.monotonic()))
            self.engine = None
        if self.ingest is not None:
            await self.ingest.close()
            self.ingest = None
        if self.events is not None:
            await self.events.close()
            self.events = None
