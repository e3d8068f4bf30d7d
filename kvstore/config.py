"""Typed configuration: embedded defaults, one TOML file, env overrides.

Precedence: defaults < TOML file < ``KVSTORE_<SECTION>__<FIELD>`` env vars <
CLI flags. Every field is validated at start; errors name the field and what
is accepted.

Example ``kvstore.toml``::

    [server]
    listen = "127.0.0.1:50051"
    metrics_port = 9100

    [dram]
    capacity = "4GiB"

    [disk]
    capacity = "100GiB"
    path = "/var/lib/kvstore"

    [redis]                      # the tier shared between hosts (off by default)
    enabled = true
    url = "redis://redis:6379/0" # or cluster_nodes = ["10.0.0.1:6379", "10.0.0.2:6379"]

    [[quotas]]                   # per-tenant limits (none by default), one table each
    namespace_prefix = "tenant-a/"
    dram = "512MiB"
    disk = "20GiB"

    [retention]                  # cache_ttl_s / Retain: soft protection per tenant
    max_ttl_s = 3600.0
    dram = "256MiB"              # bytes a tenant may retain per tier (default: fraction)

    [auth]                       # bearer tokens / client certificates -> tenants
    tenants_file = "/etc/kvstore/tenants.toml"

    [tls]
    cert_file = "/etc/kvstore/tls/server.crt"
    key_file = "/etc/kvstore/tls/server.key"

(``[auth]`` and ``[tls]``: see :mod:`kvstore.security.config`.)
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvstore.errors import ConfigError
from kvstore.security.config import AuthConfig, TlsConfig

__all__ = ["AuthConfig", "Config", "DiskConfig", "DramConfig", "EngineConfig", "QuotaConfig",
           "RedisConfig", "RetentionConfig", "ServerConfig", "TlsConfig", "build_section",
           "load_config", "parse_size"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: int | str, what: str) -> int:
    """``4096``, ``"64MiB"``, ``"1.5GB"`` -> bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size like 1073741824 or '1GiB', got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(
                f"{what}: expected a size like 1073741824 or '1GiB' "
                f"(units: {', '.join(u for u in _UNITS if u)}), got {value!r}"
            )
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 0:
        raise ConfigError(f"{what}: must be >= 0, got {value!r}")
    return n


def _parse_hostport(value: str, what: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: expected HOST:PORT (port 0-65535), got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: str = "127.0.0.1:50051"
    #: Prometheus /metrics port on the listen host; 0 disables it.
    metrics_port: int = 9100
    #: Largest single block payload accepted (bytes).
    max_block_bytes: int = 64 * 2**20
    #: gRPC max message size (bytes); must exceed max_block_bytes.
    max_message_bytes: int = 80 * 2**20
    #: Shared-memory data plane: default lease on reserved / acquired slots.
    lease_seconds: float = 30.0
    #: Longest read lease a client may ask for.
    max_lease_seconds: float = 300.0
    #: How long in-flight calls get to finish when the server stops.
    grace_seconds: float = 5.0
    #: Longest a stop (SIGTERM, SIGINT) takes: it refuses new puts at once (UNAVAILABLE),
    #: writes back to disk what DRAM holds that disk does not for up to this long less
    #: ``grace_seconds``, then gives in-flight calls ``grace_seconds`` and exits. Keep it
    #: under the orchestrator's kill deadline (Kubernetes: terminationGracePeriodSeconds).
    drain_timeout_s: float = 20.0
    #: Block hashes one call may carry (Lookup, Get, Acquire, Reserve, Commit, Put
    #: message, Delete).
    max_hashes_per_call: int = 131_072
    #: Token ids one block may carry (kept in memory with the block's metadata).
    max_block_tokens: int = 8192
    #: RPCs served at once; past it a call fails with RESOURCE_EXHAUSTED.
    max_concurrent_rpcs: int = 1024
    #: Put streams open at once.
    max_put_streams: int = 64

    def validate(self) -> None:
        _parse_hostport(self.listen, "server.listen")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"server.metrics_port: expected 0-65535, got {self.metrics_port}")
        if self.max_block_bytes <= 0:
            raise ConfigError("server.max_block_bytes: must be > 0")
        if self.max_message_bytes <= self.max_block_bytes:
            raise ConfigError(
                f"server.max_message_bytes ({self.max_message_bytes}) must exceed "
                f"server.max_block_bytes ({self.max_block_bytes})"
            )
        if not 0 < self.lease_seconds <= self.max_lease_seconds:
            raise ConfigError(
                f"server.lease_seconds: must be > 0 and <= server.max_lease_seconds "
                f"({self.max_lease_seconds}), got {self.lease_seconds}")
        if not 0 <= self.grace_seconds <= self.drain_timeout_s <= 3600:
            raise ConfigError(
                f"server.drain_timeout_s: must be in [server.grace_seconds "
                f"({self.grace_seconds!r}), 3600] seconds, got {self.drain_timeout_s!r}")
        for name in ("max_hashes_per_call", "max_block_tokens", "max_concurrent_rpcs",
                     "max_put_streams"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"server.{name}: must be > 0, got {getattr(self, name)}")


_SEGMENT_MODES = ("0600", "0660")


@dataclass(frozen=True, slots=True)
class DramConfig:
    enabled: bool = True
    capacity: int = 1 * 2**30
    #: Prefix of the POSIX shared-memory segment names.
    segment_prefix: str = "kvstore"
    #: Share of the tier that read leases may pin at once (past it, blocks are read
    #: over gRPC), so readers can never leave writers without slots.
    max_pinned_fraction: float = 0.75
    #: "0600": only this server's user maps the segment; "0660": its group too (a
    #: client container running as another user of that group).
    segment_mode: str = "0600"
    #: Group of the segment (a name or a gid); "": the server's own group.
    segment_group: str = ""

    @property
    def mode(self) -> int:
        return int(self.segment_mode, 8)

    def gid(self) -> int | None:
        """``segment_group`` as a gid (None: the server's own group)."""
        if not self.segment_group:
            return None
        if self.segment_group.isdigit():
            return int(self.segment_group)
        import grp

        try:
            return grp.getgrnam(self.segment_group).gr_gid
        except KeyError:
            raise ConfigError(f"dram.segment_group: no group {self.segment_group!r} on this "
                              "host (a group name or a numeric gid)") from None

    def validate(self) -> None:
        if self.enabled and self.capacity <= 0:
            raise ConfigError("dram.capacity: must be > 0 when dram.enabled")
        if self.segment_mode not in _SEGMENT_MODES:
            raise ConfigError(
                f"dram.segment_mode: expected one of {', '.join(map(repr, _SEGMENT_MODES))} "
                f"(a quoted octal string), got {self.segment_mode!r}")
        if self.segment_group and self.segment_mode == "0600":
            raise ConfigError(
                f"dram.segment_group: {self.segment_group!r} cannot map a 0600 segment; set "
                "dram.segment_mode = \"0660\" too")
        self.gid()
        if not 0 < self.max_pinned_fraction <= 1:
            raise ConfigError(
                f"dram.max_pinned_fraction: must be in (0, 1], got {self.max_pinned_fraction}")


@dataclass(frozen=True, slots=True)
class DiskConfig:
    enabled: bool = True
    capacity: int = 10 * 2**30
    #: Segment files directory; default: <data_dir>/disk.
    path: str = ""
    #: Size of one segment file; 0 = capacity / 64 as a power of two, 4 MiB to 1 GiB.
    segment_size: int = 0
    #: Write and read records with O_DIRECT where the filesystem supports it.
    direct_io: bool = True
    #: The recovery point: a block stored in DRAM that the policy did not drop in the
    #: meantime is queued for write-back to disk at the latest this long after its put,
    #: whatever the policy's own write-back decided (it may write sooner). A policy gets
    #: this long to judge a block worthless (a session's end, a refusal) before it costs
    #: a disk write; a ``kill -9`` loses at most this window (plus the disk's write time).
    max_write_delay_s: float = 2.0

    def validate(self) -> None:
        if self.enabled and self.capacity <= 0:
            raise ConfigError("disk.capacity: must be > 0 when disk.enabled")
        if not 0 <= self.max_write_delay_s <= 3600:
            raise ConfigError(
                f"disk.max_write_delay_s: must be in [0, 3600] seconds, got "
                f"{self.max_write_delay_s!r}")
        if self.segment_size and not (
            1 << 20 <= self.segment_size <= 1 << 40 and self.segment_size % 4096 == 0
        ):
            raise ConfigError(
                f"disk.segment_size: expected 0 (automatic) or a multiple of 4 KiB between "
                f"1 MiB and 1 TiB, got {self.segment_size}"
            )


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
    capacity: int = 4 * 2**30
    #: Values above this are split into chunks (one slot per block, via a hash tag).
    chunk_bytes: int = 4 * 2**20
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
            _parse_hostport(node, "redis.cluster_nodes")
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


@dataclass(frozen=True, slots=True)
class EngineConfig:
    #: Placement / eviction policy name (see ``kvstore.policies.available()``).
    policy: str = "workload"
    #: Copy every new block to the next slower tier in the background
    #: (write-back), so a DRAM eviction is a drop and a crash loses little.
    write_back: bool = True
    #: Prefill throughput of the served model (tokens/s) for the cost model.
    prefill_tokens_per_s: float = 10_000.0
    #: Longest HBM keep the policy may decide: how long a serving engine holds a
    #: finished request's blocks in its own KV cache for the session's next request
    #: (the vLLM connector asks at each lookup; its ``hold_max_ms`` and hold budget
    #: bound it on the engine's side). 0: never keep.
    hbm_keep_max_s: float = 10.0

    def validate(self) -> None:
        from kvstore import policies

        if self.policy not in policies.available():
            raise ConfigError(
                f"engine.policy: unknown policy {self.policy!r}; valid: "
                f"{', '.join(policies.available())}"
            )
        if self.prefill_tokens_per_s <= 0:
            raise ConfigError("engine.prefill_tokens_per_s: must be > 0")
        if not 0 <= self.hbm_keep_max_s <= 3600:
            raise ConfigError(
                f"engine.hbm_keep_max_s: must be in [0, 3600] seconds, got {self.hbm_keep_max_s!r}")


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """One tenant's byte limits per tier (a ``[[quotas]]`` table); 0 = no limit there.

    The tenant is every namespace starting with ``namespace_prefix`` (the longest
    matching prefix wins). Past its limit in a tier the tenant's own blocks there are
    evicted first; when none of them can go, its new block is not stored in that tier
    (a put spills into the next tier, or is cut at the last). Other tenants' blocks
    are never evicted for it. Limits count block payload bytes."""

    namespace_prefix: str = ""
    dram: int = 0
    disk: int = 0
    redis: int = 0

    def limits(self) -> dict[str, int]:
        """Tier name -> limit, for the limits that are set."""
        return {t: v for t, v in (("dram", self.dram), ("disk", self.disk),
                                  ("redis", self.redis)) if v > 0}


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """Retention (a client's ``cache_ttl_s`` / the Retain RPC): the longest TTL a client
    may ask for, and each tenant's retention quota per tier. A tenant is a
    ``[[quotas]]`` prefix, or else one namespace. ``dram`` / ``disk`` / ``redis``: the
    bytes a tenant may retain there; 0 = ``fraction`` of the tier's capacity."""

    max_ttl_s: float = 3600.0
    fraction: float = 0.5
    dram: int = 0
    disk: int = 0
    redis: int = 0

    def limits(self) -> dict[str, int]:
        return {t: v for t, v in (("dram", self.dram), ("disk", self.disk),
                                  ("redis", self.redis)) if v > 0}

    def validate(self) -> None:
        if not (isinstance(self.max_ttl_s, int | float) and 0 <= self.max_ttl_s <= 86_400 * 7):
            raise ConfigError(f"retention.max_ttl_s: must be in [0, 604800] seconds (0: no "
                              f"retention), got {self.max_ttl_s!r}")
        if not (isinstance(self.fraction, int | float) and 0 <= self.fraction <= 1):
            raise ConfigError(
                f"retention.fraction: must be in [0, 1] (a share of each tier's capacity), "
                f"got {self.fraction!r}")


@dataclass(frozen=True, slots=True)
class Config:
    data_dir: str = "./kvstore-data"
    log_level: str = "INFO"
    server: ServerConfig = field(default_factory=ServerConfig)
    dram: DramConfig = field(default_factory=DramConfig)
    disk: DiskConfig = field(default_factory=DiskConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    #: Event stream settings, validated by kvstore.events (kept raw here so the
    #: events package owns its own schema).
    events: Mapping[str, Any] = field(default_factory=dict)
    #: Per-tenant byte limits per tier (``[[quotas]]`` tables); none by default.
    quotas: tuple[QuotaConfig, ...] = ()

    @property
    def disk_path(self) -> Path:
        return Path(self.disk.path) if self.disk.path else Path(self.data_dir) / "disk"

    def validate(self) -> Config:
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(
                f"log_level: expected DEBUG, INFO, WARNING or ERROR, got {self.log_level!r}"
            )
        for part in (self.server, self.dram, self.disk, self.engine, self.redis, self.auth,
                     self.tls, self.retention):
            part.validate()
        if not (self.dram.enabled or self.disk.enabled or self.redis.enabled):
            raise ConfigError(
                "dram.enabled / disk.enabled / redis.enabled: at least one tier must be enabled")
        self._validate_quotas()
        return self

    def _validate_quotas(self) -> None:
        seen: set[str] = set()
        enabled = {"dram": self.dram.enabled, "disk": self.disk.enabled,
                   "redis": self.redis.enabled}
        for i, q in enumerate(self.quotas):
            what = f"quotas[{i}]"
            if not q.namespace_prefix:
                raise ConfigError(f"{what}.namespace_prefix: must be a non-empty string")
            if q.namespace_prefix in seen:
                raise ConfigError(f"{what}.namespace_prefix: {q.namespace_prefix!r} appears "
                                  "twice; one table per prefix")
            seen.add(q.namespace_prefix)
            if not q.limits():
                raise ConfigError(f"{what}: set at least one of dram, disk, redis (bytes)")
            for tier in q.limits():
                if not enabled[tier]:
                    raise ConfigError(f"{what}.{tier}: a limit for a tier that is not "
                                      f"enabled ({tier}.enabled = false)")


_SIZE_FIELDS = {"capacity", "max_block_bytes", "max_message_bytes", "chunk_bytes",
                "segment_size", "dram", "disk", "redis"}
_SECTIONS = {"server": ServerConfig, "dram": DramConfig, "disk": DiskConfig,
             "engine": EngineConfig, "redis": RedisConfig, "auth": AuthConfig, "tls": TlsConfig,
             "retention": RetentionConfig}


def _coerce(section: str, name: str, ftype: Any, value: Any) -> Any:
    what = f"{section}.{name}" if section else name
    if name in _SIZE_FIELDS:
        return parse_size(value, what)
    tname = ftype if isinstance(ftype, str) else getattr(ftype, "__name__", str(ftype))
    try:
        if tname == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if tname == "int":
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        if tname == "float":
            return float(value)
        if tname == "str":
            if not isinstance(value, str | int | float):
                raise ValueError
            return str(value)
        if tname.startswith("tuple[str"):
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
                raise ValueError
            return tuple(i.strip() for i in items if i.strip())
    except ValueError:
        expected = "a list of strings" if tname.startswith("tuple") else tname
        raise ConfigError(f"{what}: expected {expected}, got {value!r}") from None
    return value


def _section(section: str, cls: type[Any], raw: Mapping[str, Any], base: Any) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[{section}]: expected a table, got {raw!r}")
    known = {f.name: f for f in fields(cls)}
    updates = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(
                f"{section}.{key}: unknown field; valid: {', '.join(sorted(known))}"
            )
        updates[key] = _coerce(section, key, known[key].type, value)
    return replace(base, **updates)


def build_section(section: str, cls: type[Any], raw: Mapping[str, Any]) -> Any:
    """Build a component's typed config from a raw table (env strings coerced)."""
    base = cls()
    return _section(section, cls, raw, base) if raw else base


def _merge(cfg: Config, raw: Mapping[str, Any]) -> Config:
    top = {f.name: f for f in fields(Config)}
    updates: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SECTIONS:
            updates[key] = _section(key, _SECTIONS[key], value, getattr(cfg, key))
        elif key == "events":
            if not isinstance(value, Mapping):
                raise ConfigError(f"[events]: expected a table, got {value!r}")
            updates[key] = {**cfg.events, **value}
        elif key == "quotas":  # a later source replaces the whole list
            if not isinstance(value, list | tuple):
                raise ConfigError(f"quotas: expected an array of tables ([[quotas]]), "
                                  f"got {value!r}")
            updates[key] = tuple(_section(f"quotas[{i}]", QuotaConfig, item, QuotaConfig())
                                 for i, item in enumerate(value))
        elif key in top:
            updates[key] = _coerce("", key, top[key].type, value)
        else:
            raise ConfigError(f"{key}: unknown setting; valid: {', '.join(sorted(top))}")
    return replace(cfg, **updates)


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """``KVSTORE_DRAM__CAPACITY=4GiB`` -> {"dram": {"capacity": "4GiB"}};
    ``KVSTORE_DATA_DIR=/x`` -> {"data_dir": "/x"}.

    Only names of our settings are read (other tools share the ``KVSTORE_``
    prefix, e.g. ``KVSTORE_VLLM_PYTHON``); a misspelt field of a known section
    (``KVSTORE_DRAM__CAPACTY``) is still an error naming it."""
    top = {f.name for f in fields(Config)} - set(_SECTIONS) - {"events", "quotas"}
    sections = set(_SECTIONS) | {"events"}
    out: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith("KVSTORE_"):
            continue
        path = name[len("KVSTORE_"):].lower().split("__")
        if len(path) == 1 and path[0] in top:
            out[path[0]] = value
        elif len(path) == 2 and path[0] in sections:
            out.setdefault(path[0], {})[path[1]] = value
    return out


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults, then the TOML file, then env vars, then ``overrides``; validated."""
    cfg = Config()
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {str(p)!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from exc
        cfg = _merge(cfg, raw)
    cfg = _merge(cfg, _env_overrides(os.environ if env is None else env))
    if overrides:
        cfg = _merge(cfg, overrides)
    return cfg.validate()


def as_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
