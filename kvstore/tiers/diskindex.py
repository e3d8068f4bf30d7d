"""The disk tier's in-memory index: one dict of two Python ints per block.

Key: ``namespace id << 64 | xxh3-64 of the hash`` (namespaces get small ids
in the order they are first seen; the full hash, the namespace itself,
token ids and everything else about a block stay on disk, in the record and the
segment footer, and are verified when the record is read). Value: the block's
location packed into one int: segment id, offset and record length in 4 KiB
units, payload size in bytes. Together ~120 bytes per block at a million blocks
(measured by ``python -m kvstore.tiers.bench restart``), against ~1.7 KB when
the index held a BlockMeta and a path per block.

Two hashes of one namespace with the same 64-bit fingerprint (a 2^-64 chance per
pair) would share a slot: the second replaces the first, and a read of the
first finds the other's record, sees the full hash differ and answers "not
found"; never the other block's bytes.
"""

from __future__ import annotations

import xxhash

from kvstore.types import BlockKey

__all__ = ["KeyTable", "pack", "record_len_of", "seg_of", "offset_of", "position", "size_of"]

_SIZE_BITS = 40
_UNIT_BITS = 28
_UNIT = 12  # offsets and record lengths are multiples of 4096


def pack(seg_id: int, offset: int, record_len: int, size: int) -> int:
    if size >> _SIZE_BITS or (offset >> _UNIT) >> _UNIT_BITS or (record_len >> _UNIT) >> _UNIT_BITS:
        raise ValueError("block or segment too large for the index (1 TiB each)")
    return ((((seg_id << _UNIT_BITS) | offset >> _UNIT) << _UNIT_BITS | record_len >> _UNIT)
            << _SIZE_BITS) | size


def size_of(loc: int) -> int:
    return loc & ((1 << _SIZE_BITS) - 1)


def record_len_of(loc: int) -> int:
    return ((loc >> _SIZE_BITS) & ((1 << _UNIT_BITS) - 1)) << _UNIT


def offset_of(loc: int) -> int:
    return ((loc >> (_SIZE_BITS + _UNIT_BITS)) & ((1 << _UNIT_BITS) - 1)) << _UNIT


def seg_of(loc: int) -> int:
    return loc >> (_SIZE_BITS + 2 * _UNIT_BITS)


def position(loc: int) -> int:
    """Log order of a location: (segment id, offset). A later position is newer."""
    return loc >> (_SIZE_BITS + _UNIT_BITS)


class KeyTable:
    """Maps :class:`BlockKey` to the int keys of the index."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def key(self, key: BlockKey) -> int | None:
        """The int key, or None for a namespace never stored (nothing can match)."""
        ns = self._ids.get(key.namespace)
        if ns is None:
            return None
        return ns << 64 | xxhash.xxh3_64_intdigest(key.block_hash)

    def key_for_store(self, namespace: str, block_hash: bytes) -> int:
        ns = self._ids.get(namespace)
        if ns is None:
            ns = self._ids[namespace] = len(self._ids)
        return ns << 64 | xxhash.xxh3_64_intdigest(block_hash)
