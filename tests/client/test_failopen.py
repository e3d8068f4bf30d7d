"""The one fail-open client (kvstore.client.failopen) and both connectors' wrappers of it:
every check runs on FailOpenClient, the LMCache plugin's FailOpenLink and the vLLM
connector's SidecarLink, so the two connectors cannot drift apart again."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kvstore.connectors.lmcache.link import FailOpenLink
from kvstore.connectors.vllm.sidecar import SidecarLink

from kvstore.client.failopen import FailOpenClient
from kvstore.errors import InvalidBlock, TierFull, Unavailable
from tests.conftest import ServerThread, free_port, test_config

LINKS = [FailOpenClient, FailOpenLink, SidecarLink]


def _lookup(c: Any) -> int:
    return int(c.lookup("ns", [b"\x00" * 8]).num_hit)


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_server_down_fails_open_fast_and_counted_then_recovers(cls: Any, tmp_path: Path
                                                               ) -> None:
    listen = f"127.0.0.1:{free_port()}"

    def start(n: int) -> ServerThread:
        return ServerThread(test_config(tmp_path / f"d{n}",
                                        server={"listen": listen, "metrics_port": 0}))

    server = start(0)
    link = cls(listen, 1.0, 0.5)
    try:
        assert link.call("lookup", _lookup, -1) == 0 and link.is_up
        server.stop()

        started = time.monotonic()
        assert link.call("lookup", _lookup, -1) == -1  # the failure that opens the breaker
        assert time.monotonic() - started < 1.5 and not link.is_up
        assert link.stats.failures == 1 and link.stats.refused == 0
        started = time.monotonic()
        assert [link.call("lookup", _lookup, -1) for _ in range(50)] == [-1] * 50
        assert time.monotonic() - started < 0.2  # the breaker answers, no deadline each
        assert link.stats.skipped == 50 and link.stats.calls == 2

        server = start(1)  # back on the same address
        time.sleep(0.6)  # past retry_interval_s: one fresh client finds it
        assert link.call("lookup", _lookup, -1) == 0
        assert link.is_up and link.stats.reconnects == 1
        assert link.call("lookup", _lookup, -1) == 0
    finally:
        link.close()
        server.stop()


class FakeClient:
    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fake(cls: Any, clock: Clock, made: list[FakeClient], **kw: Any) -> Any:
    def factory(address: str, timeout: float) -> FakeClient:
        made.append(FakeClient(len(made)))
        return made[-1]

    return cls("h:1", 1.0, 2.0, client_factory=factory, clock=clock, **kw)


def _down(c: Any) -> int:
    raise Unavailable("connection refused")


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_one_probe_at_a_time_while_the_sidecar_may_still_be_away(cls: Any) -> None:
    clock, made = Clock(), []
    link = _fake(cls, clock, made)
    assert link.call("get", _down, -1) == -1
    clock.now += 2.5
    inside, release = threading.Event(), threading.Event()

    def probe(c: Any) -> int:
        inside.set()
        release.wait(5)
        return c.n

    t = threading.Thread(target=lambda: link.call("get", probe, -1))
    t.start()
    assert inside.wait(5)
    ran: list[int] = []
    assert link.call("get", lambda c: ran.append(c.n) or 9, -1) == -1  # skipped, not a 2nd
    assert ran == [] and len(made) == 2
    release.set()
    t.join(5)
    assert link.is_up and link.stats.reconnects == 1
    assert link.call("get", lambda c: c.n, -1) == 1


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_refusals_count_as_failures_without_the_breaker_and_log_once_per_interval(
        cls: Any, caplog: pytest.LogCaptureFixture) -> None:
    clock, made = Clock(), []
    link = _fake(cls, clock, made)

    def full(c: Any) -> None:
        raise TierFull("full")

    def bad(c: Any) -> None:
        raise InvalidBlock("hash of 3 bytes")

    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            assert link.call("put", full, None) is None
        assert link.call("put", bad, None) is None  # another error type: logged
        clock.now += 2.5
        assert link.call("put", full, None) is None  # a new interval: logged again
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 3
    assert link.is_up and not made[0].closed and len(made) == 1
    assert link.stats.failures == 7 and link.stats.refused == 7 and link.stats.calls == 7


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_a_late_success_on_a_dropped_client_does_not_close_the_breaker(cls: Any) -> None:
    clock, made = Clock(), []
    link = _fake(cls, clock, made)
    started, finish = threading.Event(), threading.Event()

    def slow(c: Any) -> int:
        started.set()
        finish.wait(5)
        return 1

    results: list[int] = []
    t = threading.Thread(target=lambda: results.append(link.call("get", slow, -1)))
    t.start()
    assert started.wait(5)
    assert link.call("get", _down, -1) == -1  # the outage drops that client
    finish.set()
    t.join(5)
    assert results == [1] and not link.is_up and link.stats.reconnects == 0
    assert link.call("get", lambda c: c.n, -1) == -1  # still open until the interval


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_a_closed_link_never_builds_a_client_again(cls: Any) -> None:
    clock, made = Clock(), []
    link = _fake(cls, clock, made)
    assert link.call("get", lambda c: c.n, -1) == 0
    link.close()
    clock.now += 10
    assert made[0].closed and link.call("get", lambda c: c.n, -1) == -1 and len(made) == 1


@pytest.mark.parametrize("cls", [FailOpenClient, SidecarLink], ids=lambda c: c.__name__)
def test_a_failing_connect_hook_is_an_outage_and_closes_that_client(cls: Any) -> None:
    clock, made = Clock(), []
    hooked: list[FakeClient] = []

    def hook(c: FakeClient) -> None:
        hooked.append(c)
        if len(hooked) == 1:
            raise OSError("cannot map the segment")

    link = _fake(cls, clock, made, on_connect=hook)
    assert link.call("get", lambda c: c.n, -1) == -1
    assert not link.is_up and made[0].closed and link.stats.failures == 1
    clock.now += 2.5
    assert link.call("get", lambda c: c.n, -1) == 1 and hooked == made and link.is_up


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_a_down_sidecar_is_a_default_then_no_call_until_the_retry_interval(cls: Any) -> None:
    clock, made = Clock(), []
    link = _fake(cls, clock, made)
    assert link.call("get", lambda c: c.n, -1) == 0 and link.is_up
    assert link.call("get", _down, -1) == -1
    assert not link.is_up and made[0].closed
    calls: list[Any] = []
    assert link.call("get", lambda c: calls.append(c) or 5, -1) == -1  # breaker open
    assert calls == [] and link.stats.skipped == 1
    clock.now += 2.5  # past retry_interval_s: one fresh client, and it works
    assert link.call("get", lambda c: c.n, -1) == 1
    assert link.is_up and link.stats.reconnects == 1 and len(made) == 2


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_unexpected_errors_fail_open_too(cls: Any) -> None:
    link = _fake(cls, Clock(), [])
    assert link.call("get", lambda c: 1 // 0, None) is None
    assert not link.is_up


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_calls_run_concurrently(cls: Any) -> None:
    link = _fake(cls, Clock(), [])
    inside = threading.Barrier(4, timeout=5)
    results: list[int] = []

    def call() -> None:
        results.append(link.call("get", lambda c: (inside.wait(), 1)[1], 0))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 4 and 0 not in results  # all four were inside at once


@pytest.mark.parametrize("cls", LINKS, ids=lambda c: c.__name__)
def test_a_client_that_cannot_be_built_is_an_outage(cls: Any) -> None:
    def factory(address: str, timeout: float) -> Any:
        raise OSError("connection refused")

    link = cls("127.0.0.1:1", 1.0, 2.0, client_factory=factory, clock=Clock())
    assert link.call("lookup", _lookup, -1) == -1
    assert not link.is_up and link.stats.failures == 1
