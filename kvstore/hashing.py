"""Block hashing, bit-for-bit equal to vLLM's chained prefix hash.

vLLM (``vllm/v1/core/kv_cache_utils.py``, ``vllm/utils/hashing.py``) hashes each
*full* block as::

    hash_fn((parent_hash or NONE_HASH, tuple(token_ids), extra_keys))

with ``hash_fn`` one of ``sha256_cbor`` (CBOR canonical + SHA-256, 32 bytes) or
``xxhash_cbor`` (CBOR canonical + xxh3-128, 16 bytes), and
``NONE_HASH = hash_fn(seed)`` where the seed is ``PYTHONHASHSEED`` when set,
else ``"vllm-none-hash"`` for sha256 (xxhash gets a random per-process seed in
vLLM unless ``PYTHONHASHSEED`` is set, so pin one). ``cache_salt`` enters the
extra keys of block 0 only, after LoRA keys. Events carry the low 64 bits of
the big-endian digest as an unsigned int.

This is the one module that connectors, the replay tooling and the tests use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cbor2
import xxhash

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "HASH_FUNCTIONS",
    "PrefixHasher",
    "block_hash_to_int",
    "hash_block_tokens",
    "none_hash",
    "sha256_cbor",
    "xxhash_cbor",
]

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash_cbor(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256_cbor": sha256_cbor,
    "xxhash_cbor": xxhash_cbor,
}


def _hash_fn(name: str) -> Callable[[Any], bytes]:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        valid = ", ".join(sorted(HASH_FUNCTIONS))
        raise ValueError(f"unknown hash function {name!r}; valid: {valid}") from None


def none_hash(hash_fn: str = "sha256_cbor", seed: str = DEFAULT_NONE_HASH_SEED) -> bytes:
    """The parent hash of block 0 (vLLM's ``NONE_HASH``) for a pinned seed.

    Pass ``seed=os.environ["PYTHONHASHSEED"]`` to match a vLLM started with it.
    """
    return _hash_fn(hash_fn)(seed)


def hash_block_tokens(
    hash_fn: str,
    parent_hash: bytes | None,
    token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    *,
    seed: str = DEFAULT_NONE_HASH_SEED,
) -> bytes:
    """Hash of one full block, chained on its parent's hash."""
    fn = _hash_fn(hash_fn)
    parent = parent_hash if parent_hash else fn(seed)
    return fn((parent, tuple(token_ids), extra_keys))


def block_hash_to_int(block_hash: bytes) -> int:
    """The unsigned 64-bit form vLLM puts in events (low 64 bits, big-endian)."""
    return int.from_bytes(block_hash, "big") & 0xFFFF_FFFF_FFFF_FFFF


@dataclass(frozen=True, slots=True)
class PrefixHasher:
    """Hashes a token sequence into its chain of full-block hashes, like vLLM.

    ``lora`` is ``(lora_name, lora_path)`` when the request uses a LoRA adapter.
    """

    block_size: int
    hash_fn: str = "sha256_cbor"
    seed: str = DEFAULT_NONE_HASH_SEED

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        _hash_fn(self.hash_fn)

    def extra_keys(
        self, block_index: int, cache_salt: str | None, lora: tuple[str, str] | None
    ) -> tuple[Any, ...] | None:
        keys: list[Any] = []
        if lora is not None:
            keys.append(("lora", lora[0], lora[1]))
        if block_index == 0 and cache_salt:
            keys.append(("cache_salt", cache_salt))
        return tuple(keys) if keys else None

    def iter_hashes(
        self,
        token_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
        parent_hash: bytes | None = None,
        start_block: int = 0,
    ) -> Iterator[bytes]:
        fn = _hash_fn(self.hash_fn)
        parent = parent_hash if parent_hash else fn(self.seed)
        bs = self.block_size
        for i in range(len(token_ids) // bs):
            extra = self.extra_keys(start_block + i, cache_salt, lora)
            parent = fn((parent, tuple(token_ids[i * bs : (i + 1) * bs]), extra))
            yield parent

    def hashes(self, token_ids: Sequence[int], **kwargs: Any) -> list[bytes]:
        return list(self.iter_hashes(token_ids, **kwargs))
