"""Domain types: keys, blocks, media, workload classes.

Frozen, slotted dataclasses; nothing here imports anything heavy.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kvstore.errors import InvalidBlock

__all__ = [
    "HASH_LENGTHS",
    "BlockData",
    "BlockKey",
    "BlockMeta",
    "Medium",
    "SessionKey",
    "Workload",
    "check_hash",
]

#: Block hash lengths vLLM hands to connectors: 32 bytes (sha256 / sha256_cbor),
#: 16 bytes (xxhash / xxhash_cbor, xxh3-128). 8 is the int64 form used in events.
HASH_LENGTHS = (8, 16, 32)


class Medium(enum.StrEnum):
    """Where a block lives, spelled as vLLM's KV events spell it."""

    GPU = "GPU"
    CPU = "CPU"
    DISK = "DISK"
    REMOTE = "REMOTE"


class Workload(enum.StrEnum):
    UNKNOWN = "unknown"
    CHAT = "chat"
    AGENT = "agent"
    RAG = "rag"
    REASONING = "reasoning"
    BATCH = "batch"
    AUTOCOMPLETE = "autocomplete"

    @classmethod
    def parse(cls, value: str | None) -> Workload:
        if not value:
            return cls.UNKNOWN
        try:
            return cls(value.lower())
        except ValueError:
            valid = ", ".join(w.value for w in cls)
            raise InvalidBlock(f"unknown workload {value!r}; valid: {valid}") from None


def check_hash(value: bytes, what: str = "block_hash") -> bytes:
    """Validate a block hash (opaque bytes of one of :data:`HASH_LENGTHS`)."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidBlock(f"{what} must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) not in HASH_LENGTHS:
        raise InvalidBlock(
            f"{what} must be 32 bytes (sha256), 16 bytes (xxhash) or 8 bytes (int64 form), "
            f"got {len(value)} bytes"
        )
    return value


class BlockKey(NamedTuple):
    """(namespace, block hash): blocks of different namespaces never mix.

    A NamedTuple rather than a dataclass: keys are hashed on every lookup and
    policy call, and a tuple hashes in C."""

    namespace: str
    block_hash: bytes

    def __str__(self) -> str:
        return f"{self.namespace}/{self.block_hash.hex()}"


class SessionKey(NamedTuple):
    """(namespace, session id): a session of one namespace. Two namespaces (tenants,
    models) with the same session id are two sessions; any character is safe in
    either part (nothing is ever joined into, or split out of, one string).

    A NamedTuple, as :class:`BlockKey`: policies hash it on every call."""

    namespace: str
    session_id: str


@dataclass(frozen=True, slots=True)
class BlockData:
    """One KV block as clients put and get it.

    ``block_hash`` and ``parent_hash`` are the bytes vLLM hands to connectors;
    ``parent_hash`` is ``None`` for the first block of a prefix.
    """

    block_hash: bytes
    parent_hash: bytes | None
    token_ids: Sequence[int]
    payload: bytes | bytearray | memoryview

    def __repr__(self) -> str:  # payloads are large: never print them
        return (
            f"BlockData(block_hash={self.block_hash.hex()[:16]}…, "
            f"tokens={len(self.token_ids)}, payload={len(self.payload)} bytes)"
        )


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """What the index keeps about a stored block (never the payload)."""

    key: BlockKey
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    size: int
    checksum: int
    session_id: str = ""
    workload: Workload = Workload.UNKNOWN
    created_at: float = 0.0
    #: Tokens the block holds (``len(token_ids)`` when token ids are kept; a trace
    #: replay keeps none and sets this alone).
    num_tokens: int = 0
