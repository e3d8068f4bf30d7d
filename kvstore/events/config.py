"""Typed config of the event stream (the ``[events]`` table)."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstore.errors import ConfigError
from kvstore.events.wire import (
    ENCODINGS,
    HASH_FORMATS,
    MEDIA,
    Encoding,
    HashFormat,
    MediaVocabulary,
)

__all__ = ["DEFAULT_MODEL", "ENDPOINT_MODES", "EventsConfig", "is_bind_endpoint"]

_SCHEMES = ("tcp://", "ipc://", "inproc://")

#: Model name the topic carries when ``events.model`` is not set (set it to the
#: served model name: llm-d's router matches the topic's model to the request's).
DEFAULT_MODEL = "default"

#: How the PUB socket uses ``events.endpoint``: ``bind`` (we own the address),
#: ``connect`` (a collector binds it), ``auto`` (vLLM's rule, :func:`is_bind_endpoint`).
ENDPOINT_MODES = ("bind", "connect", "auto")


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard and ipc/inproc endpoints; connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


@dataclass(frozen=True, slots=True)
class EventsConfig:
    """Where and how block events are published.

    ``topic`` empty means ``kv@<pod>@<model>`` (what llm-d expects); ``pod``
    empty means the host name, ``model`` defaults to :data:`DEFAULT_MODEL`.
    Both sockets listen on loopback by default; ``endpoint_mode`` says whether the
    PUB socket binds or connects. ``replay_endpoint`` empty disables replay.
    ``include_token_ids = false`` sends ``BlockStored`` with an empty token list
    (the prompt text stays on the host; a router that re-hashes tokens cannot
    use those events). ``curve_secret_key_file`` turns on CURVE encryption and
    authentication of both sockets (see ``kvstore.events.curve``).
    ``ingest_endpoint`` is the SUB socket the sidecar binds for its vLLM
    worker's own events (vLLM connects to it when its endpoint has no ``*``);
    empty disables ingest. ``media`` is the vocabulary of medium names:
    ``storage`` (vLLM >= 0.33: ``GPU`` / ``CPU`` / ``STORAGE`` with ``locality`` and
    ``ownership``; the default, what a router on the current vLLM reads) or
    ``tiers`` (``DISK`` / ``REMOTE``, for routers on older vLLM releases).
    """

    enabled: bool = True
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str = "tcp://127.0.0.1:5558"
    endpoint_mode: str = "bind"
    topic: str = ""
    pod: str = ""
    model: str = DEFAULT_MODEL
    include_token_ids: bool = True
    #: ZeroMQ certificate with the sockets' CURVE secret key; empty: no encryption.
    curve_secret_key_file: str = ""
    #: Directory of the public certificates of the clients allowed to subscribe.
    curve_client_keys_dir: str = ""
    encoding: Encoding = "map"
    hash_format: HashFormat = "int"
    media: MediaVocabulary = "storage"
    buffer_steps: int = 10_000
    hwm: int = 100_000
    #: The bus publishes at most one batch per ``batch_ms`` milliseconds: what is
    #: stored or removed meanwhile travels in the next batch (vLLM publishes one per
    #: engine step, tens of milliseconds). A save of 512 blocks lets the event loop
    #: go some 50 times; a batch at each cost as much as the commit's own work.
    #: 0: a batch each time the loop drains the queue.
    batch_ms: float = 2.0
    data_parallel_rank: int = 0
    ingest_endpoint: str = ""
    ingest_replay_endpoint: str = ""

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> EventsConfig:
        """Build from the ``[events]`` TOML table; unknown keys and wrong types are errors."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key not in fields:
                raise ConfigError(
                    f"events.{key}: unknown setting; valid: {', '.join(sorted(fields))}"
                )
            want = type(getattr(_DEFAULTS, key))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # (TOML's 5 for 5.0)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ConfigError(
                    f"events.{key} must be {want.__name__}, got {type(value).__name__} {value!r}"
                )
            values[key] = value
        return cls(**values)

    @property
    def effective_topic(self) -> str:
        if self.topic:
            return self.topic
        return f"kv@{self.pod or socket.gethostname()}@{self.model}"

    @property
    def binds(self) -> bool:
        """Whether the PUB socket binds ``endpoint`` (else it connects)."""
        if self.endpoint_mode == "auto":
            return is_bind_endpoint(self.endpoint)
        return self.endpoint_mode == "bind"

    def validate(self) -> None:
        if self.endpoint_mode not in ENDPOINT_MODES:
            raise ConfigError(
                f"events.endpoint_mode must be one of {', '.join(ENDPOINT_MODES)}; "
                f"got {self.endpoint_mode!r}"
            )
        if bool(self.curve_secret_key_file) != bool(self.curve_client_keys_dir):
            raise ConfigError(
                "events.curve_secret_key_file / events.curve_client_keys_dir: set both "
                "(CURVE on) or neither")
        if not self.topic:
            if not self.model:
                raise ConfigError(
                    "events.model: the topic kv@<pod>@<model> needs a model name "
                    f"(the served model's; default {DEFAULT_MODEL!r}), got ''"
                )
            for name in ("model", "pod"):
                if "@" in getattr(self, name):
                    raise ConfigError(
                        f"events.{name} must not contain '@' (the topic's separator), "
                        f"got {getattr(self, name)!r}"
                    )
        if self.encoding not in ENCODINGS:
            raise ConfigError(
                f"events.encoding must be one of {', '.join(ENCODINGS)}; got {self.encoding!r}"
            )
        if self.hash_format not in HASH_FORMATS:
            raise ConfigError(
                f"events.hash_format must be one of {', '.join(HASH_FORMATS)}; "
                f"got {self.hash_format!r}"
            )
        if self.media not in MEDIA:
            raise ConfigError(
                f"events.media must be one of {', '.join(MEDIA)}; got {self.media!r}"
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
        batch_ms = self.batch_ms
        if (isinstance(batch_ms, bool) or not isinstance(batch_ms, int | float)
                or not 0 <= batch_ms <= 1000):
            raise ConfigError(
                f"events.batch_ms must be a number of milliseconds from 0 to 1000, "
                f"got {batch_ms!r}")
        if not isinstance(self.data_parallel_rank, int) or self.data_parallel_rank < 0:
            raise ConfigError(
                "events.data_parallel_rank must be an integer >= 0, "
                f"got {self.data_parallel_rank!r}"
            )


_DEFAULTS = EventsConfig()
