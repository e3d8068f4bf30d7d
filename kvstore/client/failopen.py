"""The one fail-open way to reach a sidecar: misses instead of errors, fail fast, concurrently.

Both connectors (vLLM's KV connector, LMCache's remote plugin) reach the sidecar only
through :meth:`FailOpenClient.call`, with the value to return when the sidecar cannot
answer (a miss, nothing stored); the engine they serve never sees an error.

- Calls from several threads run concurrently on one client (a worker's load path and
  its save thread share it, and with it one mapping of the sidecar's shared memory);
  the lock guards only the breaker's state and the client's replacement, never a call
  or a client's close.
- An error that says the sidecar is down, slow or broken (anything but the request
  errors below, a client that cannot be built included) opens a breaker for
  ``retry_interval_s``: meanwhile calls return their default at once (``skipped``)
  instead of each waiting for a deadline. The failed client is closed and the first
  call after the interval builds a fresh one (a new channel, so a restarted sidecar is
  found at once rather than after gRPC's reconnect backoff); while that one probe is
  in flight the others still skip, so a sidecar that is still away costs one deadline
  per interval, not one per caller.
- A request error (:data:`REQUEST_ERRORS`: the sidecar answered and refused this one
  request) returns the default without the breaker; it is logged at most once per
  interval per call and error type, so a stream of refused puts cannot flood the log.
- The breaker closes on a success on the current client (``reconnects``); a late
  success of a call that started on a client the link already dropped proves nothing
  about now.
- After :meth:`close` every call answers its default; no client is built again.

Counts (:class:`LinkStats`): ``calls`` reached a client (or tried to build one);
``failures`` of them did not answer, ``refused`` of those were request errors;
``skipped`` were answered by the open breaker; ``reconnects`` closed it.

Nothing here imports a connector's engine; the client is built lazily
(``client_factory``, by default :class:`kvstore.client.KVStoreClient`), and
``on_connect`` runs on each new client (e.g. to map shared memory in the background).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kvstore.errors import (
    DataCorruption,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)

__all__ = ["REQUEST_ERRORS", "ClientFactory", "FailOpenClient", "LinkStats", "default_factory"]

T = TypeVar("T")

#: Errors about one request, not about the sidecar's health: no breaker.
REQUEST_ERRORS = (InvalidArgument, NotFound, ResourceExhausted, FailedPrecondition,
                  DataCorruption)
#: (address, timeout_s) -> a client (anything with ``close()``).
ClientFactory = Callable[[str, float], Any]

_default_logger = logging.getLogger("kvstore.client.failopen")


def default_factory(address: str, timeout: float) -> Any:
    """A :class:`kvstore.client.KVStoreClient` (imported here, on first use)."""
    from kvstore.client.sync import KVStoreClient

    return KVStoreClient(address=address, timeout=timeout)


@dataclass(slots=True)
class LinkStats:
    calls: int = 0
    failures: int = 0  # calls that did not answer: down, slow, broken or refused
    refused: int = 0  # of the failures, request errors (the sidecar is up)
    skipped: int = 0  # calls answered with the default while the breaker was open
    reconnects: int = 0


class FailOpenClient:
    """A lazily built client behind a breaker; calls run concurrently. Thread-safe.

    ``logger`` and ``fallback`` (what the caller's engine does instead, for the
    warning when the sidecar goes away) let each connector log in its own name."""

    def __init__(self, address: str, timeout_s: float, retry_interval_s: float, *,
                 client_factory: ClientFactory | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_connect: Callable[[Any], None] | None = None,
                 logger: logging.Logger | None = None,
                 fallback: str = "callers see misses") -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._retry_interval_s = retry_interval_s
        self._factory = client_factory or default_factory
        self._clock = clock
        self._on_connect = on_connect
        self._log = logger or _default_logger
        self._fallback = fallback
        self._lock = threading.Lock()  # guards the fields below, never held during a call
        self._client: Any = None
        self._retry_at = 0.0
        self._down_since: float | None = None
        self._closed = False
        self._last_refusal: dict[tuple[str, str], float] = {}
        self.stats = LinkStats()

    @property
    def is_up(self) -> bool:
        return self._down_since is None

    def call(self, what: str, fn: Callable[[Any], T], default: T) -> T:
        """``fn(client)``, or ``default`` when the sidecar is down, slow or refuses."""
        client = self._checkout()
        if client is None:
            return default
        try:
            result = fn(client)
        except REQUEST_ERRORS as exc:  # this request failed; the sidecar is up
            self._refused(what, exc)
            return default
        except Exception as exc:  # down, slow or broken: a miss
            self._failed(what, exc, client)
            return default
        if self._down_since is not None:
            self._recovered(what, client)
        return result

    def _checkout(self) -> Any:
        broken: Any = None
        with self._lock:
            if self._closed:
                return None
            now = self._clock()
            if self._down_since is not None and now < self._retry_at:
                self.stats.skipped += 1
                return None
            self.stats.calls += 1
            if self._client is None:
                try:
                    broken = self._factory(self.address, self._timeout_s)
                    if self._on_connect is not None:
                        self._on_connect(broken)
                except Exception as exc:  # a bad address, a failing hook: down, retry later
                    self.stats.failures += 1
                    self._open(now, "connect", exc)
                else:
                    self._client, broken = broken, None
                    if self._down_since is not None:
                        self._retry_at = now + self._retry_interval_s  # one probe at a time
            client = self._client
        if broken is not None:
            _close_quietly(broken, self._log)
        return client

    def _refused(self, what: str, exc: Exception) -> None:
        with self._lock:
            self.stats.failures += 1
            self.stats.refused += 1
            now = self._clock()
            key = (what, type(exc).__name__)
            if now - self._last_refusal.get(key, -1e9) < self._retry_interval_s:
                return
            self._last_refusal[key] = now
        self._log.warning("kvstore %s refused: %s: %s", what, type(exc).__name__, exc)

    def _failed(self, what: str, exc: Exception, client: Any) -> None:
        with self._lock:
            self.stats.failures += 1
            if client is not self._client:
                return  # an older client's call: the outage was already handled
            self._client = None
            self._open(self._clock(), what, exc)
        _close_quietly(client, self._log)

    def _open(self, now: float, what: str, exc: Exception) -> None:
        self._retry_at = now + self._retry_interval_s
        if self._down_since is None:
            self._down_since = now
            known = type(exc).__module__.startswith("kvstore")
            self._log.warning(
                "kvstore sidecar %s failed on %s (%s: %s); %s, retrying every %.1f s",
                self.address, what, type(exc).__name__, exc, self._fallback,
                self._retry_interval_s, exc_info=not known)

    def _recovered(self, what: str, client: Any) -> None:
        with self._lock:
            if self._down_since is None or client is not self._client:
                return
            self.stats.reconnects += 1
            down_for = self._clock() - self._down_since
            self._down_since = None
        self._log.warning("kvstore sidecar %s is back after %.1f s (%s succeeded)",
                          self.address, down_for, what)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            _close_quietly(client, self._log)


def _close_quietly(client: Any, log: logging.Logger) -> None:
    try:
        client.close()
    except Exception:  # closing a broken client may fail again
        log.debug("closing the kvstore client failed", exc_info=True)
