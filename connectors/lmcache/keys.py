"""From LMCache's ``CacheEngineKey`` to kvstore's key, ``(namespace, block hash)``.

A key's identity is (model, world size, worker id, chunk hash, dtype, tags) plus, for
layer-wise keys, the layer. Everything but the chunk hash goes into the namespace,
together with the plugin's tenant and the byte layout of a full chunk (shapes, dtypes,
memory format: what the payload must match), so tenants, cache salts (``lmcache.tag.*``
request configs become tags), tensor-parallel ranks and layouts never share a block.
The chunk hash becomes the block hash: 8 bytes, big-endian, so the sidecar's events
carry LMCache's own chunk hash as their 64-bit block hash.

Keys are read by attribute (duck-typed): nothing here imports LMCache or torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import xxhash

__all__ = ["ChunkLayout", "KeyMapper", "block_hash_of"]

NAMESPACE_PREFIX = "lmcache"
_MASK64 = 2**64 - 1


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """The bytes of a full chunk as LMCache lays them out (from its metadata)."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    fmt: str
    chunk_size: int


def block_hash_of(chunk_hash: int | bytes) -> bytes:
    """LMCache's chunk hash as an 8-byte block hash.

    LMCache's chunk hashes are 64-bit ints (signed from Python's ``hash``, unsigned
    from vLLM's ``sha256_cbor`` folded to 64 bits): those map one to one. Anything else
    (a digest, a wider int) is folded with xxh3-64, keeping one hash length per namespace.
    """
    if isinstance(chunk_hash, int) and -(2**63) <= chunk_hash <= _MASK64:
        return (chunk_hash & _MASK64).to_bytes(8, "big")
    if isinstance(chunk_hash, int):
        raw = chunk_hash.to_bytes((chunk_hash.bit_length() + 8) // 8, "big", signed=True)
    else:
        raw = bytes(chunk_hash)
    return xxhash.xxh3_64_digest(raw)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class KeyMapper:
    """Namespaces and block hashes for one LMCache engine's keys (thread-safe)."""

    def __init__(self, tenant: str, layout: ChunkLayout) -> None:
        self.tenant = tenant
        self.layout = layout
        self._namespaces: dict[tuple[Any, ...], str] = {}

    def namespace(self, key: Any) -> str:
        """``lmcache/<tenant>/<model>/<digest>/tp<worker>of<world>``: the readable parts
        are for people reading stats; the digest covers every part of the identity."""
        ident = (key.model_name, key.world_size, key.worker_id, _dtype_name(key.dtype),
                 tuple(key.tags or ()), getattr(key, "layer_id", None))
        ns = self._namespaces.get(ident)
        if ns is None:
            ns = self._namespaces[ident] = self._make(*ident)
        return ns

    def _make(self, model: str, world_size: int, worker_id: int, dtype: str,
              tags: tuple[tuple[str, Any], ...], layer_id: int | None) -> str:
        fields = {"tenant": self.tenant, "model": model, "world_size": world_size,
                  "worker_id": worker_id, "dtype": dtype,
                  "tags": [[str(k), str(v)] for k, v in tags], "layer_id": layer_id,
                  "layout": asdict(self.layout)}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        short = model.rstrip("/").rsplit("/", 1)[-1] or "model"
        layer = "" if layer_id is None else f"/layer{layer_id}"
        parallel = f"tp{worker_id}of{world_size}{layer}"
        return f"{NAMESPACE_PREFIX}/{self.tenant}/{short}/{digest}/{parallel}"

    def block_hash(self, key: Any) -> bytes:
        return block_hash_of(key.chunk_hash)

    def runs(self, keys: Sequence[Any]) -> Iterator[tuple[str, range]]:
        """The keys cut into runs of consecutive keys of one namespace, in order (a
        lookup's prefix stops at the first run that is not fully stored)."""
        start = 0
        current = ""
        for i, key in enumerate(keys):
            ns = self.namespace(key)
            if i and ns != current:
                yield current, range(start, i)
                start = i
            current = ns
        if keys:
            yield current, range(start, len(keys))
