"""Connections to one Redis or a Redis Cluster, and what their failures mean.

redis-py (asyncio, hiredis parser) is imported here only, when the first
client is made. Every call the tier makes goes through :meth:`Link.run`: a
deadline (``asyncio.timeout``), and a breaker that, after a failure, answers
"unavailable" at once for ``retry_interval`` seconds instead of letting every
request wait on a dead or blackholed server; the next call after that tries
again, and the pool reconnects by itself (one immediate retry covers the
stale pooled connection a restarted server leaves behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kvstore.tiers.redisconfig import RedisConfig

__all__ = ["Down", "Link", "make_client", "raise_transient"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Down(Exception):
    """Redis could not answer (internal: the tier turns it into a miss or TierUnavailable).

    ``kind`` is ``"unavailable"`` (connection refused or lost, cluster down, failing
    over), ``"timeout"``, ``"oom"`` (Redis at maxmemory refused a write) or
    ``"skipped"`` (the breaker is open after a recent failure)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def raise_transient(results: list[Any]) -> list[Any]:
    """Pipeline results (``raise_on_error=False``) with no failure of the server or the
    link: those (a node lost mid-pipeline, CLUSTERDOWN, TRYAGAIN, ...) are raised, so the
    call counts as unavailable. A plain ResponseError (e.g. WRONGTYPE) is left in place:
    it says something about that value, not about Redis."""
    from redis.exceptions import ResponseError

    for r in results:
        if isinstance(r, Exception) and type(r) is not ResponseError:
            raise r
    return results


def make_client(cfg: RedisConfig) -> Any:
    """A ``redis.asyncio.Redis`` (``url``) or ``RedisCluster`` (``cluster_nodes``)."""
    from redis.asyncio import BlockingConnectionPool, Redis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    common: dict[str, Any] = {
        "socket_timeout": cfg.timeout,
        "socket_connect_timeout": cfg.connect_timeout,
        "retry": Retry(NoBackoff(), 1),
    }
    if cfg.password:
        common["password"] = cfg.password
    if cfg.username:
        common["username"] = cfg.username
    if cfg.cluster:
        nodes = [ClusterNode(h, int(p)) for h, _, p in (n.rpartition(":")
                                                         for n in cfg.cluster_nodes)]
        return RedisCluster(startup_nodes=nodes, require_full_coverage=False,
                            max_connections=cfg.max_connections, **common)
    pool = BlockingConnectionPool.from_url(cfg.url, max_connections=cfg.max_connections,
                                           timeout=cfg.timeout, **common)
    return Redis(connection_pool=pool)


class Link:
    """One client (made lazily, on the running loop) behind a deadline and a breaker."""

    def __init__(self, cfg: RedisConfig, name: str, *,
                 clock: Callable[[], float] = time.monotonic,
                 factory: Callable[[RedisConfig], Any] = make_client) -> None:
        self.cfg = cfg
        self.name = name
        self._clock = clock
        self._factory = factory
        self._client: Any = None
        self._open_until = 0.0
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.failures = 0

    @property
    def down(self) -> bool:
        """True while the breaker is open (calls are answered "unavailable" at once)."""
        return self._clock() < self._open_until

    async def client(self) -> Any:
        """The client, made on first use. A Cluster client reads the slot map before any
        command is sent (redis-py's lazy initialisation races under concurrent first
        calls)."""
        if self._closed:
            raise Down("unavailable", f"tier {self.name!r} is closed")
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    client = self._factory(self.cfg)
                    if self.cfg.cluster:
                        try:
                            await client.initialize()
                        except BaseException:
                            with contextlib.suppress(Exception):
                                await client.aclose()
                            raise
                    self._client = client
        return self._client

    async def run(self, what: str, call: Callable[[Any], Awaitable[T]],
                  timeout: float | None = None) -> T:
        """``await call(client)`` within the deadline; failures raise :class:`Down`."""
        from redis import exceptions as rex

        if self.down:
            raise Down("skipped", f"redis skipped for {self._open_until - self._clock():.2f}s "
                                  "more after a failure")
        deadline = self.cfg.timeout if timeout is None else timeout

        try:
            async with asyncio.timeout(deadline):  # no extra task per call, unlike wait_for
                out = await call(await self.client())
        except Down:
            raise
        except rex.OutOfMemoryError as exc:  # a refused write; reads still work
            raise Down("oom", f"redis is at maxmemory, {what} refused: {exc}") from exc
        except (TimeoutError, rex.TimeoutError) as exc:
            self._trip()
            raise Down("timeout", f"redis {what} took over {deadline}s") from exc
        except Exception as exc:  # redis, socket, or a driver bug: Redis is not usable now
            self._trip()
            raise Down("unavailable", f"redis {what} failed: {type(exc).__name__}: {exc}") \
                from exc
        return out

    def _trip(self) -> None:
        """After a failure: skip Redis for ``retry_interval`` and start the next call on a
        fresh client (new connections; a Cluster client re-reads the slot map, so it finds
        the replica promoted in place of a lost master)."""
        self.failures += 1
        if not self.down:
            log.warning("tier %r: redis failing, treated as a miss for %.1fs",
                        self.name, self.cfg.retry_interval)
        self._open_until = self._clock() + self.cfg.retry_interval
        old, self._client = self._client, None
        if old is not None:  # closed once the calls still using it are past their deadline
            task = asyncio.get_running_loop().create_task(self._close_later(old))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_later(self, client: Any) -> None:
        await asyncio.sleep(self.cfg.timeout)
        with contextlib.suppress(Exception):
            await client.aclose()

    async def close(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        for task in list(self._closing):
            task.cancel()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()
