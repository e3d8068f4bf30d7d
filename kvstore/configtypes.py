"""Field parsers and markers that every component's config schema shares.

Each component owns its schema next to its code (:mod:`kvstore.tiers.dram`,
:mod:`kvstore.tiers.disk.config`, :mod:`kvstore.tiers.redisconfig`,
:mod:`kvstore.engine.config`, :mod:`kvstore.events.config`,
:mod:`kvstore.security.config`); :mod:`kvstore.config` loads a file and the environment
and composes them. This module sits below all of them (it imports only
:mod:`kvstore.errors`), so a tier can declare its schema without importing the loader
or anything above it.
"""

from __future__ import annotations

import re
from dataclasses import field
from typing import Any

from kvstore.errors import ConfigError

__all__ = ["is_size_field", "parse_hostport", "parse_size", "size_field"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

_SIZE = "kvstore.size"


def size_field(default: int) -> Any:
    """A byte-count field: the loader accepts ``4096`` or ``"64MiB"`` for it
    (:func:`parse_size`), from a file or an env var alike."""
    return field(default=default, metadata={_SIZE: True})


def is_size_field(f: Any) -> bool:
    """Whether a dataclass field was declared with :func:`size_field`."""
    return bool(f.metadata.get(_SIZE, False))


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


def parse_hostport(value: str, what: str) -> str:
    """``HOST:PORT`` (port 0-65535), returned unchanged; an error names ``what``."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: expected HOST:PORT (port 0-65535), got {value!r}")
    return value
