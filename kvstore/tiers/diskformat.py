"""The self-describing block file of the disk tier.

Layout (little-endian)::

    prefix  36 bytes  magic "KVSB", version u16, flags u16, meta_len u32,
                      payload_size u64, payload xxh3-64 u64, meta xxh3-64 u64
    meta    meta_len  msgpack map: namespace, block hash, parent hash, token ids,
                      size, session id, workload, created_at
    payload payload_size bytes

A file is intact when its prefix parses, the meta checksum matches, and the file
size is exactly ``36 + meta_len + payload_size``; the payload checksum is
verified on every read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgspec
import xxhash

from kvstore.types import BlockKey, BlockMeta, Workload

__all__ = [
    "MAGIC",
    "PREFIX",
    "VERSION",
    "BadBlockFile",
    "Header",
    "decode_meta",
    "decode_prefix",
    "encode_header",
    "file_name",
]

MAGIC = b"KVSB"
VERSION = 1
PREFIX = struct.Struct("<4sHHIQQQ")
_MAX_META = 16 << 20


class BadBlockFile(Exception):
    """A block file that is not intact (internal: the tier turns it into its own errors)."""


@dataclass(frozen=True, slots=True)
class Header:
    meta_len: int
    payload_size: int
    checksum: int
    meta_checksum: int

    @property
    def payload_offset(self) -> int:
        return PREFIX.size + self.meta_len

    @property
    def file_size(self) -> int:
        return PREFIX.size + self.meta_len + self.payload_size


def file_name(key: BlockKey) -> str:
    """``<hash hex>.<namespace xxh3-64 hex>.kvb``; the header holds the full namespace."""
    ns = xxhash.xxh3_64_hexdigest(key.namespace.encode())
    return f"{key.block_hash.hex()}.{ns}.kvb"


def encode_header(meta: BlockMeta, checksum: int) -> bytes:
    fields: dict[str, Any] = {
        "ns": meta.key.namespace,
        "hash": meta.key.block_hash,
        "parent": meta.parent_hash,
        "tokens": list(meta.token_ids),
        "size": meta.size,
        "session": meta.session_id,
        "workload": str(meta.workload),
        "created": meta.created_at,
    }
    body = msgspec.msgpack.encode(fields)
    prefix = PREFIX.pack(
        MAGIC, VERSION, 0, len(body), meta.size, checksum, xxhash.xxh3_64_intdigest(body)
    )
    return prefix + body


def decode_prefix(buf: bytes | memoryview) -> Header:
    if len(buf) < PREFIX.size:
        raise BadBlockFile(f"file shorter than the {PREFIX.size}-byte header")
    magic, version, _flags, meta_len, size, checksum, meta_checksum = PREFIX.unpack_from(buf)
    if magic != MAGIC:
        raise BadBlockFile(f"bad magic {magic!r}")
    if version != VERSION:
        raise BadBlockFile(f"unsupported block file version {version}")
    if meta_len > _MAX_META:
        raise BadBlockFile(f"implausible metadata length {meta_len}")
    return Header(meta_len, size, checksum, meta_checksum)


def decode_meta(header: Header, body: bytes | memoryview) -> BlockMeta:
    if len(body) != header.meta_len or xxhash.xxh3_64_intdigest(body) != header.meta_checksum:
        raise BadBlockFile("metadata checksum mismatch")
    try:
        f = msgspec.msgpack.decode(body)
        meta = BlockMeta(
            key=BlockKey(f["ns"], bytes(f["hash"])),
            parent_hash=None if f["parent"] is None else bytes(f["parent"]),
            token_ids=tuple(int(t) for t in f["tokens"]),
            size=int(f["size"]),
            checksum=header.checksum,
            session_id=f["session"],
            workload=Workload(f["workload"]),
            created_at=float(f["created"]),
        )
    except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
        raise BadBlockFile(f"undecodable metadata: {exc}") from exc
    if meta.size != header.payload_size:
        raise BadBlockFile("metadata size disagrees with the header")
    return meta
