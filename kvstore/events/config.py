"""Typed config of the event stream (the ``[events]`` table)."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstore.errors import ConfigError
from kvstore.events.wire import ENCODINGS, HASH_FORMATS, Encoding, HashFormat

__all__ = ["EventsConfig", "is_bind_endpoint"]

_SCHEMES = ("tcp://", "ipc://", "inproc://")


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard and ipc/inproc endpoints; connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


@dataclass(frozen=True, slots=True)
class EventsConfig:
    """Where and how block events are published.

    ``topic`` empty means ``kv@<pod>@<model>`` (what llm-d expects); ``pod``
    empty means the host name. ``replay_endpoint`` empty disables replay.
    ``ingest_endpoint`` is the SUB socket the sidecar binds for its vLLM
    worker's own events (vLLM connects to it when its endpoint has no ``*``);
    empty disables ingest.
    """

    enabled: bool = True
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str = "tcp://*:5558"
    topic: str = ""
    pod: str = ""
    model: str = ""
    encoding: Encoding = "map"
    hash_format: HashFormat = "int"
    buffer_steps: int = 10_000
    hwm: int = 100_000
    data_parallel_rank: int = 0
    ingest_endpoint: str = ""
    ingest_replay_endpoint: str = ""

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> EventsConfig:
        """Build from the ``[events]`` TOML table; unknown keys and wrong types are errors."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in table.items():
            if key not in fields:
                raise ConfigError(
                    f"events.{key}: unknown setting; valid: {', '.join(sorted(fields))}"
                )
            want = type(getattr(_DEFAULTS, key))
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ConfigError(
                    f"events.{key} must be {want.__name__}, got {type(value).__name__} {value!r}"
                )
        return cls(**dict(table))

    @property
    def effective_topic(self) -> str:
        if self.topic:
            return self.topic
        return f"kv@{self.pod or socket.gethostname()}@{self.model}"

    def validate(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ConfigError(
                f"events.encoding must be one of {', '.join(ENCODINGS)}; got {self.encoding!r}"
            )
        if self.hash_format not in HASH_FORMATS:
            raise ConfigError(
                f"events.hash_format must be one of {', '.join(HASH_FORMATS)}; "
                f"got {self.hash_format!r}"
            )
        for name in ("endpoint", "replay_endpoint", "ingest_endpoint", "ingest_replay_endpoint"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ConfigError(f"events.{name} must be a string, got {type(value).__name__}")
            if (value or name == "endpoint") and not value.startswith(_SCHEMES):
                raise ConfigError(
                    f"events.{name} must be a ZMQ endpoint starting with "
                    f"{', '.join(_SCHEMES)}; got {value!r}"
                )
        if self.ingest_endpoint and self.ingest_endpoint == self.endpoint:
            raise ConfigError("events.ingest_endpoint must differ from events.endpoint")
        for name in ("buffer_steps", "hwm"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"events.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.data_parallel_rank, int) or self.data_parallel_rank < 0:
            raise ConfigError(
                "events.data_parallel_rank must be an integer >= 0, "
                f"got {self.data_parallel_rank!r}"
            )


_DEFAULTS = EventsConfig()
