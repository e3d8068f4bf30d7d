"""Typed settings of the LMCache plugin, read from LMCache's ``extra_config``.

LMCache loads a remote-storage plugin by name: ``remote_storage_plugins: ["kvstore"]``
plus ``remote_storage_plugin.kvstore.module_path`` / ``.class_name`` in
``extra_config``. The plugin's own settings sit beside those two keys, under the
same prefix (the full plugin name, e.g. ``kvstore.primary``, or its type
``kvstore``)::

    remote_storage_plugin.kvstore.address: "127.0.0.1:50051"
    remote_storage_plugin.kvstore.tenant: "acme"
    remote_storage_plugin.kvstore.timeout_s: 2.0
    remote_storage_plugin.kvstore.cache_ttl_s: 300   # retain what it stores, 5 min

Every setting is optional. An unknown key under the prefix or a value of the wrong
type is refused with a :class:`~kvstore.errors.ConfigError` naming the key and what
it accepts. Nothing here imports LMCache or torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvstore.errors import ConfigError, InvalidArgument
from kvstore.types import Workload

__all__ = ["PLUGIN_TYPE", "PluginConfig"]

#: The plugin type LMCache matches (``plugin://kvstore`` or ``plugin://kvstore.<instance>``).
PLUGIN_TYPE = "kvstore"
#: LMCache's own keys under the plugin prefix (how it finds the class), not ours.
_LMCACHE_KEYS = frozenset({"module_path", "class_name"})


@dataclass(frozen=True, slots=True)
class PluginConfig:
    #: gRPC address of the kvstore sidecar.
    address: str = "127.0.0.1:50051"
    #: Longest LMCache waits on one operation; a slower sidecar is a miss.
    timeout_s: float = 2.0
    #: After a failure, how long the plugin answers misses without asking (fail fast).
    retry_interval_s: float = 2.0
    #: Tenant part of the namespace: tenants never share chunks.
    tenant: str = "default"
    #: Workload class the sidecar's policy files the chunks under.
    workload: str = Workload.UNKNOWN.value
    #: Threads that move bytes to and from the sidecar (concurrent requests).
    threads: int = 8
    #: Map the sidecar's shared memory into this process in the background when the
    #: plugin connects (else the first touch of each page costs a fault on the data
    #: path: measured here, an 8 MiB chunk's copy out of a fresh mapping took 0.85 ms
    #: instead of 0.43).
    prefault: bool = True
    #: Hand LMCache blocking batched gets as memory objects over the sidecar's slots
    #: themselves (no copy; the read lease holds until LMCache frees them), where
    #: LMCache frees what it retrieved right after loading it: when its local CPU
    #: cache is off (``local_cpu: false``). Otherwise every get copies.
    zero_copy: bool = True
    #: With ``zero_copy``: a contains takes the read lease of the prefix it finds in
    #: the same round trip (``lookup_and_hold``) and keeps those slots this long for
    #: the get that follows (LMCache's retrieve asks contains, then get): the get
    #: then makes no round trip. A contains that no get follows holds them this long.
    #: 0: a contains only looks up.
    hold_ahead_s: float = 1.0
    #: Retain every chunk the plugin stores for this many seconds (the sidecar's
    #: retention: soft protection within the tenant's retention quota, up to the
    #: sidecar's ``retention.max_ttl_s``). 0: no retention.
    cache_ttl_s: float = 0.0

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None,
                          plugin_name: str = PLUGIN_TYPE) -> PluginConfig:
        """Settings under ``remote_storage_plugin.<plugin_name>.`` (the instance name
        first, then its type: ``kvstore.primary`` falls back to ``kvstore``)."""
        extra = dict(extra or {})
        names = dict.fromkeys((plugin_name, plugin_name.split(".", 1)[0]))
        known = {f.name for f in fields(cls)}
        defaults = cls()
        values: dict[str, Any] = {}
        for name in reversed(names):  # the instance's own keys win over the type's
            prefix = f"remote_storage_plugin.{name}."
            for key, value in extra.items():
                if not key.startswith(prefix):
                    continue
                field = key[len(prefix):]
                if field in _LMCACHE_KEYS or "." in field:  # LMCache's, or an instance's
                    continue
                if field not in known:
                    raise ConfigError(f"extra_config[{key!r}]: unknown setting {field!r}; "
                                      f"valid: {sorted(known)}")
                values[field] = _coerce(key, value, type(getattr(defaults, field)))
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"address must be 'host:port', got {self.address!r}")
        for name in ("timeout_s", "retry_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.hold_ahead_s <= 60:
            raise ConfigError(f"hold_ahead_s must be between 0 and 60 s, got "
                              f"{self.hold_ahead_s!r}")
        if not 0 <= self.cache_ttl_s <= 7 * 86_400:
            raise ConfigError(f"cache_ttl_s must be between 0 and 604800 s (0: no retention), "
                              f"got {self.cache_ttl_s!r}")
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads!r}")
        if not self.tenant:
            raise ConfigError("tenant must be a non-empty string")
        try:
            Workload.parse(self.workload)
        except InvalidArgument as exc:
            raise ConfigError(f"workload: {exc}") from exc


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _coerce(key: str, value: Any, expected: type) -> Any:
    """YAML gives typed values, LMCache's env overrides give strings: accept both."""
    if isinstance(value, str) and expected in (int, float):
        with contextlib.suppress(ValueError):
            value = expected(value)
    if isinstance(value, str) and expected is bool:
        value = _BOOLS.get(value.strip().lower(), value)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, expected) and not (expected is not bool and isinstance(value, bool)):
        return value
    raise ConfigError(f"extra_config[{key!r}] must be {expected.__name__}, "
                      f"got {type(value).__name__} {value!r}")
