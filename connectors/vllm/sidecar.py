"""The connector's one way to reach the sidecar: :class:`kvstore.client.failopen.FailOpenClient`.

Every sidecar call goes through :meth:`SidecarLink.call` with the value to use when
the sidecar cannot answer (a miss, nothing stored); the engine never sees an error and
recomputes. Calls from several threads run concurrently on one client (the worker's
load path and its save thread share it, and with it one mapping of the sidecar's shared
memory). The breaker, the counts and what opens it are the shared client's (its
docstring); this module only names the connector's logger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kvstore.client.failopen import ClientFactory, FailOpenClient, LinkStats

__all__ = ["LinkStats", "SidecarLink"]

logger = logging.getLogger("kvstore.connectors.vllm")


class SidecarLink(FailOpenClient):
    """The shared fail-open client, logging as the vLLM connector. ``on_connect`` runs
    on each new client (the worker maps the sidecar's shared memory with it)."""

    def __init__(self, address: str, timeout_s: float, retry_interval_s: float, *,
                 client_factory: ClientFactory | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_connect: Callable[[Any], None] | None = None) -> None:
        super().__init__(address, timeout_s, retry_interval_s, client_factory=client_factory,
                         clock=clock, on_connect=on_connect, logger=logger,
                         fallback="serving without it (recompute)")
