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

Each component owns its section's schema next to its code and this module composes
them: ``[dram]`` :mod:`kvstore.tiers.dramconfig`, ``[disk]`` :mod:`kvstore.tiers.disk.config`,
``[redis]`` :mod:`kvstore.tiers.redisconfig`, ``[engine]`` / ``[[quotas]]`` /
``[retention]`` :mod:`kvstore.engine.config`, ``[auth]`` / ``[tls]``
:mod:`kvstore.security.config`, ``[events]`` :mod:`kvstore.events.config` (kept raw here,
built by the server). ``[server]`` stays here: the loader is the server's own front door,
and a ``kvstore.server.config`` would make this module and the server package import each
other. The shared field parsers (sizes, HOST:PORT) are in :mod:`kvstore.configtypes`; a
component marks a byte-count field with ``size_field`` and the loader accepts ``"64MiB"``
for it. Every name is re-exported here (``from kvstore.config import RedisConfig``).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvstore.configtypes import is_size_field, parse_hostport, parse_size, size_field
from kvstore.engine.config import EngineConfig, QuotaConfig, RetentionConfig, validate_quotas
from kvstore.errors import ConfigError
from kvstore.security.config import AuthConfig, TlsConfig
from kvstore.tiers.disk.config import DiskConfig
from kvstore.tiers.dramconfig import DramConfig
from kvstore.tiers.redisconfig import RedisConfig

__all__ = ["AuthConfig", "Config", "DiskConfig", "DramConfig", "EngineConfig", "QuotaConfig",
           "RedisConfig", "RetentionConfig", "ServerConfig", "TlsConfig", "build_section",
           "load_config", "parse_size"]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: str = "127.0.0.1:50051"
    #: Prometheus /metrics port on the listen host; 0 disables it.
    metrics_port: int = 9100
    #: Largest single block payload accepted (bytes).
    max_block_bytes: int = size_field(64 * 2**20)
    #: gRPC max message size (bytes); must exceed max_block_bytes.
    max_message_bytes: int = size_field(80 * 2**20)
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
    #: Every this many seconds, a collection of the objects made since the last one and
    #: the survivors frozen (``gc.freeze``), so the cyclic collector never walks the
    #: whole index on the event loop (0.3-0.8 s at 100,000-200,000 stored blocks);
    #: 0: Python's own collections (see ``kvstore.server.heap``).
    gc_freeze_s: float = 0.25
    #: How long a thread may keep the GIL while another waits for it
    #: (``sys.setswitchinterval``; Python's default is 5 ms). With the loop busy, a
    #: thread that has a result for it (or the loop, while a thread runs Python) waited
    #: up to that long for each turn: 0.5 ms cut the loop's busy lag p99 with Lookups
    #: back to back 2.6 to 5.6 times (docs/benchmarks/dataplane.md, 2026-12-08).
    gil_switch_s: float = 0.0005

    def validate(self) -> None:
        parse_hostport(self.listen, "server.listen")
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
        if not 0 <= self.gc_freeze_s <= 3600:
            raise ConfigError(
                f"server.gc_freeze_s: must be in [0, 3600] seconds, got {self.gc_freeze_s!r}")
        if not 0 < self.gil_switch_s <= 1:
            raise ConfigError(
                f"server.gil_switch_s: must be in (0, 1] seconds, got {self.gil_switch_s!r}")
        for name in ("max_hashes_per_call", "max_block_tokens", "max_concurrent_rpcs",
                     "max_put_streams"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"server.{name}: must be > 0, got {getattr(self, name)}")


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
        validate_quotas(self.quotas, {"dram": self.dram.enabled, "disk": self.disk.enabled,
                                      "redis": self.redis.enabled})


_SECTIONS = {"server": ServerConfig, "dram": DramConfig, "disk": DiskConfig,
             "engine": EngineConfig, "redis": RedisConfig, "auth": AuthConfig, "tls": TlsConfig,
             "retention": RetentionConfig}


def _coerce(section: str, f: dataclasses.Field[Any], value: Any) -> Any:
    name, ftype = f.name, f.type
    what = f"{section}.{name}" if section else name
    if is_size_field(f):  # declared by its component with configtypes.size_field
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
        updates[key] = _coerce(section, known[key], value)
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
            updates[key] = _coerce("", top[key], value)
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
