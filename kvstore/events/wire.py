"""KV event wire structs, byte-compatible with vLLM's ``vllm/distributed/kv_events.py``.

A published message is the msgpack form of a :class:`KVEventBatch`, always a
positional array ``[ts, events, data_parallel_rank]``. The *events* inside it
have had two encodings in vLLM's history, and both are supported:

``"map"`` (vLLM >= 0.24)
    each event is a map tagged by ``"type"``:
    ``{"type": "BlockStored", "block_hashes": [...], ...}``
``"array"`` (vLLM <= 0.23)
    each event is a positional array whose first element is the tag:
    ``["BlockStored", block_hashes, parent_block_hash, token_ids, ...]``

Fields are only ever appended (as vLLM does). In the array form msgspec writes
every field, and an older decoder ignores the trailing ones it does not know;
our decoder accepts the shorter arrays of older publishers (vLLM <= 0.10 had
six ``BlockStored`` fields). Block hashes are either the
unsigned low 64 bits of the digest (``"int"``, vLLM's default
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) or the raw digest bytes.

The array variants subclass the map ones, so consumers test
``isinstance(ev, BlockStored)`` whichever encoding the bytes used.

Media: vLLM 0.33 names three, ``GPU``, ``CPU`` and ``STORAGE`` (every secondary
tier below host memory), and tells storage tiers apart by ``locality`` (``LOCAL`` /
``REMOTE`` relative to the publisher) and ``ownership`` (the tier's identifier).
Older releases, and kvstore before it, spelled the tiers ``DISK`` and ``REMOTE``;
:data:`MEDIA` names the two vocabularies (``events.media``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, TypeAlias

import msgspec

from kvstore.hashing import block_hash_to_int

__all__ = [
    "ENCODINGS",
    "HASH_FORMATS",
    "LOCAL",
    "MEDIA",
    "MEDIUM_STORAGE",
    "REMOTE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Encoding",
    "ExternalBlockHash",
    "HashFormat",
    "MediaVocabulary",
    "KVCacheEvent",
    "KVEventBatch",
    "MalformedBatch",
    "cleared",
    "decode_batch",
    "encode_batch",
    "external_hash",
    "removed",
    "stored",
    "to_encoding",
]

Encoding: TypeAlias = Literal["map", "array"]
HashFormat: TypeAlias = Literal["int", "bytes"]
ENCODINGS: Final = ("map", "array")
HASH_FORMATS: Final = ("int", "bytes")

#: ``storage``: vLLM 0.33's media (``GPU`` / ``CPU`` / ``STORAGE`` with ``locality``
#: and ``ownership``); ``tiers``: the older ``DISK`` / ``REMOTE`` names.
MediaVocabulary: TypeAlias = Literal["storage", "tiers"]
MEDIA: Final = ("storage", "tiers")
MEDIUM_STORAGE: Final = "STORAGE"
LOCAL: Final = "LOCAL"
REMOTE: Final = "REMOTE"

#: What vLLM calls ``ExternalBlockHash``: ``bytes`` or the 64-bit int form.
ExternalBlockHash: TypeAlias = bytes | int


class MalformedBatch(ValueError):
    """A payload that is not a msgpack ``KVEventBatch`` (counted and skipped by readers)."""


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    #: ``LOCAL`` / ``REMOTE`` relative to the publisher (``None``: unspecified).
    locality: str | None = None
    #: The secondary tier that stored the block (``dram``, ``disk``, ``redis``).
    ownership: str | None = None
    #: The session whose request stored the block.
    session_id: str | None = None
    #: Speculative tokens past the block (append-only; kvstore sends none).
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class _ArrayBlockStored(BlockStored, array_like=True, tag="BlockStored"):
    pass


class _ArrayBlockRemoved(BlockRemoved, array_like=True, tag="BlockRemoved"):
    pass


class _ArrayAllBlocksCleared(AllBlocksCleared, array_like=True, tag="AllBlocksCleared"):
    pass


# Decoding only: vLLM <= 0.10 sent six BlockStored fields (no lora_name) and
# early releases no medium; what an old publisher left out decodes as None.
class _OldArrayBlockStored(BlockStored, array_like=True, tag="BlockStored"):
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class _OldArrayBlockRemoved(BlockRemoved, array_like=True, tag="BlockRemoved"):
    medium: str | None = None


Event: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """``[ts, events, data_parallel_rank]``, as vLLM's ``KVEventBatch``."""

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_ARRAY_CLASS: Final[dict[type[KVCacheEvent], type[KVCacheEvent]]] = {
    BlockStored: _ArrayBlockStored,
    BlockRemoved: _ArrayBlockRemoved,
    AllBlocksCleared: _ArrayAllBlocksCleared,
}
_MAP_CLASS: Final = {v: k for k, v in _ARRAY_CLASS.items()} | {
    _OldArrayBlockStored: BlockStored,
    _OldArrayBlockRemoved: BlockRemoved,
}

_encoder = msgspec.msgpack.Encoder()
_raw_decoder = msgspec.msgpack.Decoder(_RawBatch)
_map_decoder = msgspec.msgpack.Decoder(BlockStored | BlockRemoved | AllBlocksCleared)
_array_decoder = msgspec.msgpack.Decoder(
    _OldArrayBlockStored | _OldArrayBlockRemoved | _ArrayAllBlocksCleared
)


def external_hash(block_hash: bytes, hash_format: HashFormat) -> ExternalBlockHash:
    """The form of a block hash that goes on the wire."""
    return block_hash_to_int(block_hash) if hash_format == "int" else bytes(block_hash)


def _convert_hash(value: ExternalBlockHash, hash_format: HashFormat) -> ExternalBlockHash:
    if hash_format == "int":
        return value if isinstance(value, int) else block_hash_to_int(value)
    return value if isinstance(value, bytes) else value.to_bytes(8, "big")


def to_encoding(
    event: KVCacheEvent, encoding: Encoding, hash_format: HashFormat | None = None
) -> KVCacheEvent:
    """Re-type ``event`` for ``encoding`` (and re-form its hashes if ``hash_format``)."""
    cls = type(event)
    base = _MAP_CLASS.get(cls, cls)
    target = _ARRAY_CLASS[base] if encoding == "array" else base
    if target is cls and hash_format is None:
        return event
    fields = msgspec.structs.asdict(event)
    if hash_format is not None:
        if "block_hashes" in fields:
            fields["block_hashes"] = [_convert_hash(h, hash_format) for h in fields["block_hashes"]]
        parent = fields.get("parent_block_hash")
        if parent is not None:
            fields["parent_block_hash"] = _convert_hash(parent, hash_format)
    return target(**fields)


def stored(
    block_hashes: Sequence[ExternalBlockHash],
    parent_block_hash: ExternalBlockHash | None,
    token_ids: Sequence[int],
    block_size: int,
    medium: str | None,
    *,
    encoding: Encoding = "map",
    lora_name: str | None = None,
    extra_keys: list[tuple[Any, ...] | None] | None = None,
    locality: str | None = None,
    ownership: str | None = None,
    session_id: str | None = None,
) -> BlockStored:
    """Build a ``BlockStored`` of the class ``encoding`` needs."""
    cls = _ArrayBlockStored if encoding == "array" else BlockStored
    return cls(
        block_hashes=list(block_hashes),
        parent_block_hash=parent_block_hash,
        token_ids=list(token_ids),
        block_size=block_size,
        lora_id=None,
        medium=medium,
        lora_name=lora_name,
        extra_keys=extra_keys,
        locality=locality,
        ownership=ownership,
        session_id=session_id,
    )


def removed(
    block_hashes: Sequence[ExternalBlockHash],
    medium: str | None,
    *,
    encoding: Encoding = "map",
    locality: str | None = None,
    ownership: str | None = None,
) -> BlockRemoved:
    cls = _ArrayBlockRemoved if encoding == "array" else BlockRemoved
    return cls(block_hashes=list(block_hashes), medium=medium, locality=locality,
               ownership=ownership)


def cleared(*, encoding: Encoding = "map") -> AllBlocksCleared:
    return _ArrayAllBlocksCleared() if encoding == "array" else AllBlocksCleared()


def encode_batch(
    ts: float, events: list[KVCacheEvent], data_parallel_rank: int | None = 0
) -> bytes:
    """msgpack ``[ts, events, data_parallel_rank]``; each event keeps its own encoding."""
    return _encoder.encode(KVEventBatch(ts, events, data_parallel_rank))  # type: ignore[arg-type]


def _is_msgpack_array(raw: msgspec.Raw) -> bool:
    first = memoryview(raw)[0] if len(raw) else 0
    return 0x90 <= first <= 0x9F or first in (0xDC, 0xDD)


def decode_batch(payload: bytes | memoryview) -> KVEventBatch:
    """Decode a batch in either encoding (per event); raise :class:`MalformedBatch`."""
    try:
        raw = _raw_decoder.decode(payload)
        events: list[Event] = [
            (_array_decoder if _is_msgpack_array(ev) else _map_decoder).decode(ev)
            for ev in raw.events
        ]
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        # (RecursionError: msgspec's answer to nesting deeper than the interpreter allows)
        raise MalformedBatch(f"undecodable KV event batch ({len(payload)} bytes): {exc}") from exc
    return KVEventBatch(raw.ts, events, raw.data_parallel_rank)
