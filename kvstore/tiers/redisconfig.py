"""The ``[redis]`` config section: the Redis tier's own schema (loaded by :mod:`kvstore.config`).

Kept out of :mod:`kvstore.tiers.redis` so the loader reads it without redis-py."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvstore.configtypes import parse_hostport, size_field
from kvstore.errors import ConfigError

__all__ = ["RedisConfig"]


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """The shared tier: one Redis (``url``) or a Redis Cluster (``cluster_nodes``).

    ``capacity`` is this sidecar's budget in the shared store: the payload bytes of the
    blocks its index holds in Redis (written by it, or found there and adopted); the
    engine evicts (deletes) its own blocks past it. Redis's ``maxmemory`` bounds the
    store as a whole. Timeouts bound every call: past them Redis counts as a miss."""

    enabled: bool = False
    #: ``redis://[USER:PASSWORD@]HOST:PORT/DB``, ``rediss://...`` (TLS) or ``unix://PATH``.
    url: str = ""
    #: ``["HOST:PORT", ...]`` of a Redis Cluster (any subset of its nodes); instead of url.
    cluster_nodes: tuple[str, ...] = ()
    username: str = ""
    password: str = ""
    capacity: int = size_field(4 * 2**30)
    #: Values above this are split into chunks (one slot per block, via a hash tag).
    chunk_bytes: int = size_field(4 * 2**20)
    #: Default time-to-live of stored blocks, seconds; 0 = none (Redis's maxmemory
    #: policy is then the only thing that ever removes an abandoned block).
    ttl_seconds: float = 3600.0
    #: A read renews the block's TTL once less than half of it is left (so a TTL acts as
    #: "unused for about that long").
    refresh_ttl_on_read: bool = True
    key_prefix: str = "kvstore"
    #: Deadline of one operation (a pipeline of a batch), seconds.
    timeout: float = 1.0
    #: Deadline of a lookup's probe for the rest of a prefix, seconds.
    probe_timeout: float = 0.1
    connect_timeout: float = 0.5
    #: After a failure Redis is skipped (every call a miss) this long, then retried.
    retry_interval: float = 1.0
    max_connections: int = 32
    #: Copy every block the policy admits to Redis in the background (other hosts find
    #: it at once); false: Redis only receives blocks demoted from the tier above.
    write_through: bool = True
    #: Most hashes a lookup probes in Redis past the local prefix.
    probe_max_blocks: int = 256
    #: Read bandwidth from Redis, bytes/s: the cost model loads a Redis hit only when
    #: that beats recomputing its tokens.
    read_bytes_per_s: float = 1e9

    @property
    def cluster(self) -> bool:
        return bool(self.cluster_nodes)

    def validate(self) -> None:
        if self.enabled and bool(self.url) == bool(self.cluster_nodes):
            raise ConfigError(
                "redis.url / redis.cluster_nodes: set exactly one when redis.enabled "
                f"(url={self.url!r}, cluster_nodes={list(self.cluster_nodes)!r})")
        if self.url:
            _parse_redis_url(self.url)
        for node in self.cluster_nodes:
            parse_hostport(node, "redis.cluster_nodes")
        positive = {"capacity": self.capacity, "timeout": self.timeout,
                    "probe_timeout": self.probe_timeout,
                    "connect_timeout": self.connect_timeout,
                    "max_connections": self.max_connections,
                    "read_bytes_per_s": self.read_bytes_per_s}
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"redis.{name}: must be > 0, got {value!r}")
        if not 64 * 2**10 <= self.chunk_bytes <= 512 * 2**20:
            raise ConfigError(
                f"redis.chunk_bytes: expected 64KiB to 512MiB, got {self.chunk_bytes}")
        for name, value in (("ttl_seconds", self.ttl_seconds),
                            ("retry_interval", self.retry_interval),
                            ("probe_max_blocks", self.probe_max_blocks)):
            if value < 0:
                raise ConfigError(f"redis.{name}: must be >= 0, got {value!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", self.key_prefix):
            raise ConfigError(
                "redis.key_prefix: expected letters, digits and _.:- (no braces or spaces), "
                f"got {self.key_prefix!r}")
        if not self.enabled and (self.url or self.cluster_nodes):
            # Refused rather than enabled: the default cannot be told from an explicit
            # "enabled = false", which must never turn Redis on.
            where = "redis.url" if self.url else "redis.cluster_nodes"
            raise ConfigError(
                f"redis.enabled: {where} is set but redis.enabled is false (the default); "
                f"set redis.enabled = true to use the Redis tier, or remove {where}")


def _parse_redis_url(url: str) -> None:
    from urllib.parse import urlsplit

    what = "redis.url"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{what}: not a URL ({exc}): {url!r}") from None
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(f"{what}: unix:// needs a socket path, got {url!r}")
        return
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(
            f"{what}: expected redis://HOST:PORT/DB, rediss://... or unix://PATH, got {url!r}")
    db = parts.path.lstrip("/")
    if not parts.hostname or (db and not db.isdigit()) or port == 0:
        raise ConfigError(f"{what}: expected redis://HOST:PORT/DB (DB a number), got {url!r}")


