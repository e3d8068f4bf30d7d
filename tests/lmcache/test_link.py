"""The plugin's fail-open link (no LMCache needed): misses instead of errors, a breaker
that fails fast while the sidecar is away, a fresh client when it is back, and calls
that run concurrently rather than one at a time."""

from __future__ import annotations

import threading
import time
from typing import Any

from kvstore.connectors.lmcache.link import FailOpenLink

from kvstore.errors import InvalidBlock, Unavailable
from tests.conftest import free_port


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


def _link(clock: Clock, made: list[FakeClient]) -> FailOpenLink:
    def factory(address: str, timeout: float) -> FakeClient:
        made.append(FakeClient(len(made)))
        return made[-1]

    return FailOpenLink("h:1", 1.0, 2.0, client_factory=factory, clock=clock)


def test_a_down_sidecar_is_a_default_then_no_call_until_the_retry_interval() -> None:
    clock, made = Clock(), []
    link = _link(clock, made)
    assert link.call("get", lambda c: c.n, -1) == 0 and link.is_up

    def down(c: Any) -> int:
        raise Unavailable("connection refused")

    assert link.call("get", down, -1) == -1
    assert not link.is_up and made[0].closed
    calls = []
    assert link.call("get", lambda c: calls.append(c) or 5, -1) == -1  # breaker open
    assert calls == [] and link.stats.skipped == 1

    clock.now += 2.5  # past retry_interval_s: one fresh client, and it works
    assert link.call("get", lambda c: c.n, -1) == 1
    assert link.is_up and link.stats.reconnects == 1 and len(made) == 2


def test_a_refused_request_is_a_default_without_the_breaker() -> None:
    clock, made = Clock(), []
    link = _link(clock, made)

    def bad(c: Any) -> int:
        raise InvalidBlock("hash of 3 bytes")

    assert link.call("put", bad, 0) == 0
    assert link.is_up and link.stats.refused == 1 and not made[0].closed
    assert link.call("put", lambda c: 7, 0) == 7


def test_unexpected_errors_fail_open_too() -> None:
    link = _link(Clock(), [])
    assert link.call("get", lambda c: 1 // 0, None) is None
    assert not link.is_up


def test_calls_run_concurrently() -> None:
    link = _link(Clock(), [])
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


def test_closed_link_answers_defaults() -> None:
    clock, made = Clock(), []
    link = _link(clock, made)
    link.call("get", lambda c: 1, 0)
    link.close()
    assert made[0].closed and link.call("get", lambda c: 1, 0) == 0


def test_real_client_against_no_server_is_a_prompt_default() -> None:
    link = FailOpenLink(f"127.0.0.1:{free_port()}", 1.0, 5.0)
    started = time.monotonic()
    assert link.call("lookup", lambda c: c.lookup("ns", [b"\x00" * 8]).num_hit, 0) == 0
    assert time.monotonic() - started < 1.5 and not link.is_up
