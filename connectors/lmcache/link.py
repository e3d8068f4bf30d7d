"""The plugin's one way to reach the sidecar: :class:`kvstore.client.failopen.FailOpenClient`.

Every sidecar call goes through :meth:`FailOpenLink.call` with the value to return
when the sidecar cannot answer (a miss, nothing stored); calls run concurrently on one
client (LMCache serves several requests at once) and LMCache never sees an error. The
breaker, the counts and what opens it are the shared client's (its docstring); this
module only names the plugin's logger and its shared-memory prefault.

Nothing here imports LMCache; the client is built lazily (``client_factory``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kvstore.client.failopen import ClientFactory, FailOpenClient, LinkStats, default_factory

__all__ = ["FailOpenLink", "LinkStats", "prefaulting_factory"]

logger = logging.getLogger("kvstore.connectors.lmcache")


def prefaulting_factory(address: str, timeout: float) -> Any:
    """A client that maps the sidecar's shared memory in the background at once."""
    client = default_factory(address, timeout)
    client.prefault_in_background()
    return client


class FailOpenLink(FailOpenClient):
    """The shared fail-open client, logging as the LMCache plugin."""

    def __init__(self, address: str, timeout_s: float, retry_interval_s: float, *,
                 client_factory: ClientFactory | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(address, timeout_s, retry_interval_s, client_factory=client_factory,
                         clock=clock, logger=logger, fallback="LMCache sees misses")
