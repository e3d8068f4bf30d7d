"""A disk that returns EIO: demotions that fail are warned about, counted per tier and
cause in /metrics, and turn the KVStore service's health to NOT_SERVING until a write
succeeds again. The fault is the real disk tier's record write failing with EIO (its
``pwrite`` wrapper raises, in the writer thread), so the tier's own error path runs."""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvstore import KVStoreClient
from kvstore.server.app import SERVICE_NAME
from tests.blocks import make_chain

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Eio:
    """``write_at`` of the disk tier's group writer, failing with EIO while ``on``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.on = threading.Event()

    def __call__(self, fd: int, data: memoryview, offset: int) -> None:
        if self.on.is_set():
            raise OSError(errno.EIO, "Input/output error (injected)")
        self.real(fd, data, offset)


def _health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return int(health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status)


def _wait_health(address: str, service: str, want: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _health(address, service) == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"health of {service!r} is {_health(address, service)}, not {want}")


def test_failed_demotions_are_warned_counted_and_degrade_health(
        server_factory: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from prometheus_client import generate_latest

    from kvstore.metrics import make_registry
    from kvstore.tiers.disk import log as disklog

    eio = Eio(disklog.write_at)
    monkeypatch.setattr(disklog, "write_at", eio)
    # lru: every DRAM victim is demoted to disk; no write-back, so the victims' only
    # way to disk is the demotion (which the EIO makes fail).
    srv = server_factory(dram={"capacity": "2MiB"}, engine={"policy": "lru",
                                                           "write_back": False},
                         server={"drain_timeout_s": 6.0})
    assert _health(srv.address, SERVICE_NAME) == SERVING
    eio.on.set()
    caplog.set_level(logging.WARNING, logger="kvstore.engine")
    with KVStoreClient(srv.address, shared_memory=False) as c:
        c.put("m", make_chain(64, 64 * 1024, seed=1))  # 4 MiB through a 2 MiB DRAM tier
        st = c.stats()
    assert st.demotions_failed >= 5, st
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and "demotion" in r.getMessage() and "unavailable" in r.getMessage()]
    assert 1 <= len(warned) <= 2, [r.getMessage() for r in caplog.records]  # rate-limited
    text = generate_latest(make_registry(srv.engine, srv.server.events)).decode()
    assert ('kvstore_demotions_failed_total{cause="unavailable",dst="disk",src="dram"} '
            f"{float(st.demotions_failed)}") in text, text
    assert 'kvstore_tier_degraded{tier="disk"} 1.0' in text
    # The KVStore service is degraded; the process itself still serves (probes without
    # a service name keep passing: a failing cache disk neither restarts the sidecar nor
    # takes its worker out of service).
    _wait_health(srv.address, SERVICE_NAME, NOT_SERVING)
    assert _health(srv.address, "") == SERVING

    eio.on.clear()  # the disk heals: the next write that lands clears the state
    with KVStoreClient(srv.address, shared_memory=False) as c:
        c.put("m", make_chain(48, 64 * 1024, seed=2))
    _wait_health(srv.address, SERVICE_NAME, SERVING)
    text = generate_latest(make_registry(srv.engine, srv.server.events)).decode()
    assert 'kvstore_tier_degraded{tier="disk"} 0.0' in text
