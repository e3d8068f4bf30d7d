"""The plugin's one way to reach the sidecar: fail open, fail fast, concurrently.

Every sidecar call goes through :meth:`FailOpenLink.call` with the value to return
when the sidecar cannot answer (a miss, nothing stored). Calls run concurrently on
one client (LMCache serves several requests at once). A failure that says the
sidecar is down or slow opens a breaker for ``retry_interval_s``: meanwhile calls
return their default at once instead of each waiting for a deadline, and the first
call after it builds a fresh client (a new channel, so a restarted sidecar is found
at once rather than after gRPC's reconnect backoff). LMCache never sees an error.

Nothing here imports LMCache; the client is built lazily (``client_factory``).
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

__all__ = ["FailOpenLink", "LinkStats", "prefaulting_factory"]

logger = logging.getLogger("kvstore.connectors.lmcache")

T = TypeVar("T")

#: Errors about one request, not about the sidecar's health: no breaker.
_REQUEST_ERRORS = (InvalidArgument, NotFound, ResourceExhausted, FailedPrecondition, DataCorruption)
ClientFactory = Callable[[str, float], Any]


def _default_factory(address: str, timeout: float) -> Any:
    from kvstore.client import KVStoreClient

    return KVStoreClient(address=address, timeout=timeout)


def prefaulting_factory(address: str, timeout: float) -> Any:
    """A client that maps the sidecar's shared memory in the background at once."""
    client = _default_factory(address, timeout)
    client.prefault_in_background()
    return client


@dataclass(slots=True)
class LinkStats:
    calls: int = 0
    failures: int = 0
    refused: int = 0  # request errors (the sidecar is up)
    skipped: int = 0  # calls answered with the default while the breaker was open
    reconnects: int = 0


class FailOpenLink:
    """A lazily built client behind a breaker; calls run concurrently."""

    def __init__(self, address: str, timeout_s: float, retry_interval_s: float, *,
                 client_factory: ClientFactory | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._retry_interval_s = retry_interval_s
        self._factory = client_factory or _default_factory
        self._clock = clock
        self._lock = threading.Lock()  # guards the fields below, never held during a call
        self._client: Any = None
        self._retry_at = 0.0
        self._down_since: float | None = None
        self._closed = False
        self._last_refusal: dict[str, float] = {}
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
        except _REQUEST_ERRORS as exc:  # this request failed; the sidecar is up
            self._refused(what, exc)
            return default
        except Exception as exc:  # down, slow or broken: a miss
            self._failed(what, exc, client)
            return default
        if self._down_since is not None:
            self._recovered(what)
        return result

    def _checkout(self) -> Any:
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
                    self._client = self._factory(self.address, self._timeout_s)
                except Exception as exc:  # a bad address: stay down, retry later
                    self._open(now, "connect", exc)
                    return None
                if self._down_since is not None:
                    self._retry_at = now + self._retry_interval_s  # one probe at a time
            return self._client

    def _refused(self, what: str, exc: Exception) -> None:
        with self._lock:
            self.stats.refused += 1
            now = self._clock()
            key = f"{what}:{type(exc).__name__}"
            if now - self._last_refusal.get(key, -1e9) < self._retry_interval_s:
                return
            self._last_refusal[key] = now
        logger.warning("kvstore %s refused: %s: %s", what, type(exc).__name__, exc)

    def _failed(self, what: str, exc: Exception, client: Any) -> None:
        with self._lock:
            self.stats.failures += 1
            if client is not self._client:
                return  # an older client's call: the outage was already handled
            self._client = None
            self._open(self._clock(), what, exc)
        _close_quietly(client)

    def _open(self, now: float, what: str, exc: Exception) -> None:
        self._retry_at = now + self._retry_interval_s
        if self._down_since is None:
            self._down_since = now
            known = type(exc).__module__.startswith("kvstore")
            logger.warning("kvstore sidecar %s failed on %s (%s: %s); LMCache sees misses, "
                           "retrying every %.1f s", self.address, what, type(exc).__name__,
                           exc, self._retry_interval_s, exc_info=not known)

    def _recovered(self, what: str) -> None:
        with self._lock:
            if self._down_since is None:
                return
            self.stats.reconnects += 1
            down_for = self._clock() - self._down_since
            self._down_since = None
        logger.warning("kvstore sidecar %s is back after %.1f s (%s succeeded)",
                       self.address, down_for, what)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            _close_quietly(client)


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # closing a broken client may fail again
        logger.debug("closing the kvstore client failed", exc_info=True)
