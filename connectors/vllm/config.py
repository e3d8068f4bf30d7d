"""Typed settings of the vLLM connector and the namespace fingerprint.

Settings come from ``kv_connector_extra_config``; every key is optional::

    {"address": "127.0.0.1:50051", "tenant": "acme", "hold_max_ms": 2000}

Credentials for a sidecar that requires them come from the worker's environment
(``KVSTORE_TOKEN``, ``KVSTORE_TLS_CA`` ...; see :mod:`kvstore.security.client`) or
from the ``token`` / ``tls*`` keys here; prefer the environment for the token, since
vLLM logs its config.

Unknown keys and values of the wrong type are refused at engine start with a
:class:`~kvstore.errors.ConfigError` that names the key and what it accepts.
Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from kvstore.connectors.vllm.sessions import ToolCallMarkers

from kvstore.errors import ConfigError
from kvstore.types import Workload

if TYPE_CHECKING:
    from kvstore.security.client import ClientSecurity

__all__ = ["ConnectorConfig", "LayoutFingerprint", "namespace_for"]

NAMESPACE_PREFIX = "vllm"


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    #: gRPC address of the kvstore sidecar.
    address: str = "127.0.0.1:50051"
    #: Deadline of one sidecar call; a slower sidecar counts as down.
    timeout_s: float = 2.0
    #: After a failed call, how long the connector stops asking (fail fast).
    retry_interval_s: float = 2.0
    #: Tenant part of the namespace: tenants never share blocks.
    tenant: str = "default"
    #: Model part of the namespace; defaults to vLLM's model name or path.
    model_id: str = ""
    #: Load prefixes from the sidecar.
    load: bool = True
    #: Save full blocks to the sidecar.
    save: bool = True
    #: Send turn-end hints from ``request_finished``.
    hints: bool = True
    #: Load off the forward step (vLLM's ``load_kv_async``): the loading request
    #: waits in ``WAITING_FOR_REMOTE_KVS`` on a connector thread while the other
    #: requests keep decoding, and is scheduled once ``get_finished`` reports its
    #: blocks in place (a load past ``timeout_s`` or failed is recomputed). False:
    #: load inside the step that first reads the blocks (the step cannot end before
    #: the load; on a GPU the copies overlap that forward layer by layer).
    load_async: bool = True
    #: Loads shorter than this many blocks are not worth a round trip.
    min_load_blocks: int = 1
    #: HBM keep: the longest the engine holds a finished request's blocks in its own
    #: KV cache for the session's next request (the cheapest keep: reused with no
    #: copy). Whether and how long is the sidecar policy's decision (``keep_ms``,
    #: answered with the request's lookup from what the request says its turn ends
    #: with); this caps it. 0 disables holding.
    hold_max_ms: float = 0.0
    #: Most engine blocks held at once by HBM keeps; a keep that would pass it is
    #: not made (the blocks are released, offloaded by what was saved). 0: a
    #: quarter of the engine's KV cache.
    hold_budget_blocks: int = 0
    #: Map the sidecar's shared memory into the worker in the background when it
    #: connects (first touches otherwise page-fault on the data path; costs page
    #: tables: 2 MiB per GiB of the sidecar's DRAM tier).
    prefault: bool = True
    #: Host threads that copy between shared memory and pinned staging and
    #: checksum payloads, for KV caches on a GPU (the CPU backend uses one).
    host_threads: int = 4
    #: How long the scheduler side reuses a waiting request's lookup answer (vLLM
    #: asks on every step it cannot schedule the request); 0: ask every time.
    lookup_max_age_s: float = 1.0
    #: Tool-call markers (token ids): a generation that stops on one of these ends
    #: its turn with a tool call (e.g. Llama 3's ``<|eom_id|>``).
    tool_call_stop_token_ids: tuple[int, ...] = ()
    #: Tool-call markers (token id sequences): an output that contains one of these
    #: holds a complete tool call (e.g. the ids of ``</tool_call>``).
    tool_call_token_sequences: tuple[tuple[int, ...], ...] = ()
    #: Workload class when neither the request nor its session says.
    default_workload: str = Workload.UNKNOWN.value
    #: Bearer token for the sidecar; empty: ``KVSTORE_TOKEN`` from the environment.
    token: str = ""
    #: Connect with TLS (implied by tls_ca_file / tls_cert_file); the server is verified.
    tls: bool = False
    #: CA bundle that signs the sidecar's certificate (default: the system's roots).
    tls_ca_file: str = ""
    #: Client certificate and key, for a sidecar that requires mutual TLS.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: Name to check the sidecar's certificate against when the address is an IP.
    tls_server_name: str = ""

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> ConnectorConfig:
        extra = dict(extra or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ConfigError(
                f"kv_connector_extra_config: unknown key(s) {unknown}; valid: {sorted(known)}"
            )
        values: dict[str, Any] = {}
        defaults = cls()
        for name, value in extra.items():
            if name in _TOKEN_LISTS:
                values[name] = _token_ids(name, value, _TOKEN_LISTS[name])
                continue
            expected = type(getattr(defaults, name))
            values[name] = _coerce(name, value, expected)
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if not self.address or ":" not in self.address:
            raise ConfigError(f"address must be 'host:port', got {self.address!r}")
        if self.lookup_max_age_s < 0:
            raise ConfigError(f"lookup_max_age_s must be >= 0, got {self.lookup_max_age_s!r}")
        for name in ("timeout_s", "retry_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.hold_max_ms < 0:
            raise ConfigError(f"hold_max_ms must be >= 0, got {self.hold_max_ms!r}")
        if self.hold_budget_blocks < 0:
            raise ConfigError(
                f"hold_budget_blocks must be >= 0, got {self.hold_budget_blocks!r}")
        if self.host_threads < 1:
            raise ConfigError(f"host_threads must be >= 1, got {self.host_threads!r}")
        if self.min_load_blocks < 1:
            raise ConfigError(f"min_load_blocks must be >= 1, got {self.min_load_blocks!r}")
        if not self.tenant:
            raise ConfigError("tenant must be a non-empty string")
        Workload.parse(self.default_workload)
        self.security()

    def security(self) -> ClientSecurity:
        """The environment's credentials, with the keys set here taking precedence."""
        from kvstore.security.client import ClientSecurity

        return ClientSecurity.from_env().merged(
            token=self.token or None, tls=True if self.tls else None,
            ca_file=self.tls_ca_file, cert_file=self.tls_cert_file,
            key_file=self.tls_key_file, server_name=self.tls_server_name)

    def client_factory(self) -> Callable[[str, float], Any]:
        """Builds the sidecar client (for :class:`~connectors.vllm.sidecar.SidecarLink`)."""
        security = self.security()

        def make(address: str, timeout: float) -> Any:
            from kvstore.client import KVStoreClient

            return KVStoreClient(address=address, timeout=timeout, security=security)

        return make


    def tool_call_markers(self) -> ToolCallMarkers:
        return ToolCallMarkers(frozenset(self.tool_call_stop_token_ids),
                               self.tool_call_token_sequences)


#: Keys that take token ids: how deep their lists nest (1: ids, 2: sequences of ids).
_TOKEN_LISTS = {"tool_call_stop_token_ids": 1, "tool_call_token_sequences": 2}


def _token_ids(name: str, value: Any, depth: int) -> tuple[Any, ...]:
    """A list of token ids (depth 1) or of non-empty lists of them (depth 2), as tuples."""
    what = "a list of token ids" if depth == 1 else "a list of non-empty lists of token ids"
    if not isinstance(value, list | tuple):
        raise ConfigError(f"kv_connector_extra_config[{name!r}] must be {what}, "
                          f"got {type(value).__name__} {value!r}")
    out: list[Any] = []
    for item in value:
        if depth == 2:
            if not isinstance(item, list | tuple) or not item:
                raise ConfigError(f"kv_connector_extra_config[{name!r}] must be {what}, "
                                  f"got the item {item!r}")
            out.append(_token_ids(name, item, 1))
        elif isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            out.append(item)
        else:
            raise ConfigError(f"kv_connector_extra_config[{name!r}] must be {what}, "
                              f"got the item {item!r}")
    return tuple(out)


def _coerce(name: str, value: Any, expected: type) -> Any:
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, expected):
        return value
    raise ConfigError(
        f"kv_connector_extra_config[{name!r}] must be {expected.__name__}, "
        f"got {type(value).__name__} {value!r}"
    )


@dataclass(frozen=True, slots=True)
class LayoutFingerprint:
    """What makes two engines' KV blocks interchangeable.

    Two engines agree on a namespace only if every field agrees; the payload
    header additionally carries the worker's measured tensor layout, so even
    a fingerprint that misses something never loads foreign bytes.
    """

    model: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    tp_rank: int
    tp_size: int
    device: str
    hash_algo: str
    tenant: str
    pp_rank: int = 0
    pp_size: int = 1

    def digest(self) -> str:
        fields_json = json.dumps(
            {f.name: getattr(self, f.name) for f in fields(self)}, sort_keys=True
        )
        return hashlib.sha256(fields_json.encode()).hexdigest()[:16]


def namespace_for(fp: LayoutFingerprint) -> str:
    """Readable and collision-safe: ``vllm/<tenant>/<model>/<digest>/tp<r>of<n>[/pp<r>of<n>]``.

    The readable parts are for people reading stats; the digest is what keeps
    layouts apart (it covers every field, the readable ones included).
    """
    model = fp.model.rstrip("/").rsplit("/", 1)[-1] or "model"
    pp = f"/pp{fp.pp_rank}of{fp.pp_size}" if fp.pp_size > 1 else ""
    parallel = f"tp{fp.tp_rank}of{fp.tp_size}{pp}"
    return f"{NAMESPACE_PREFIX}/{fp.tenant}/{model}/{fp.digest()}/{parallel}"
