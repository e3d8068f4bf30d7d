"""The connector's one way to reach the sidecar: fail open, fail fast.

Every sidecar call goes through :meth:`SidecarLink.call` with the value to
use when the sidecar cannot answer (a miss, nothing stored). A failure opens
a breaker for ``retry_interval_s``: during that time calls return the default
at once instead of waiting for a deadline on every request, and the next call
after it builds a fresh client (reconnects). The engine never sees an error.

Calls from several threads run concurrently on one client (the worker's load
path and its save thread share it, and with it one mapping of the sidecar's
shared memory); only the breaker's state and the client's replacement are
under the lock.
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

__all__ = ["LinkStats", "SidecarLink"]

logger = logging.getLogger("kvstore.connectors.vllm")

T = TypeVar("T")

#: Errors about one request, not about the sidecar's health: no breaker.
_REQUEST_ERRORS = (InvalidArgument, NotFound, ResourceExhausted, FailedPrecondition, DataCorruption)
ClientFactory = Callable[[str, float], Any]


def _default_factory(address: str, timeout: float) -> Any:
    from kvstore.client import KVStoreClient

    return KVStoreClient(address=address, timeout=timeout)


@dataclass(slots=True)
class LinkStats:
    calls: int = 0
    failures: int = 0
    skipped: int = 0  # calls answered with the default while the breaker was open
    reconnects: int = 0


class SidecarLink:
    """A lazily connected client behind a breaker. Thread-safe."""

    def __init__(
        self,
        address: str,
        timeout_s: float,
        retry_interval_s: float,
        *,
        client_factory: ClientFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_connect: Callable[[Any], None] | None = None,
    ) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._retry_interval_s = retry_interval_s
        self._factory = client_factory or _default_factory
        self._clock = clock
        self._on_connect = on_connect
        self._lock = threading.Lock()
        self._client: Any = None
        self._retry_at = 0.0
        self._down_since: float | None = None
        self.stats = LinkStats()

    @property
    def is_up(self) -> bool:
        return self._down_since is None

    def call(self, what: str, fn: Callable[[Any], T], default: T) -> T:
        """``fn(client)``, or ``default`` when the sidecar is down, slow or errs."""
        with self._lock:
            now = self._clock()
            if self._down_since is not None and now < self._retry_at:
                self.stats.skipped += 1
                return default
            self.stats.calls += 1
            try:
                if self._client is None:
                    self._client = self._factory(self.address, self._timeout_s)
                    if self._on_connect is not None:
                        self._on_connect(self._client)
            except Exception as exc:
                self._on_failure(what, exc, now, None)
                return default
            client = self._client
        try:
            result = fn(client)
        except _REQUEST_ERRORS as exc:  # this request failed; the sidecar is up
            with self._lock:
                self.stats.failures += 1
            logger.warning("kvstore %s refused: %s: %s", what, type(exc).__name__, exc)
            return default
        except Exception as exc:  # down, slow or broken: fail open, recompute
            with self._lock:
                self._on_failure(what, exc, self._clock(), client)
            return default
        with self._lock:
            if self._down_since is not None and self._client is client:
                self.stats.reconnects += 1
                logger.warning(
                    "kvstore sidecar %s is back after %.1f s (%s succeeded)",
                    self.address,
                    now - self._down_since,
                    what,
                )
                self._down_since = None
        return result

    def _on_failure(self, what: str, exc: Exception, now: float, client: Any) -> None:
        self.stats.failures += 1
        if client is not None and client is not self._client:
            return  # a call on a client already replaced: that failure was counted
        self._retry_at = now + self._retry_interval_s
        if self._down_since is None:
            self._down_since = now
            known = exc.__class__.__module__.startswith("kvstore")
            logger.warning(
                "kvstore sidecar %s failed on %s (%s: %s); serving without it "
                "(recompute), retrying every %.1f s",
                self.address,
                what,
                type(exc).__name__,
                exc,
                self._retry_interval_s,
                exc_info=not known,
            )
        self._drop_client()

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken client may fail again
                logger.debug("closing the kvstore client failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._drop_client()
