"""How a block is laid out in Redis: key names and the self-describing header.

One block is ``1 + n`` string keys sharing one hash tag, so that in a Redis
Cluster they all live in one slot (one node, one pipeline)::

    <prefix>:{<namespace tag>.<hash hex>}:h     header (below)
    <prefix>:{<namespace tag>.<hash hex>}:0     payload bytes [0, chunk)
    <prefix>:{<namespace tag>.<hash hex>}:1     payload bytes [chunk, 2 chunk) ...

The namespace tag is the xxh3-64 of the namespace; the header carries the full
namespace and hash, so two tenants whose tags collide still never see each
other's blocks (a header naming another key is a miss). Header layout
(little-endian)::

    prefix  40 bytes  magic "KVSR", version u16, flags u16, meta_len u32,
                      payload_size u64, payload xxh3-64 u64, meta xxh3-64 u64,
                      chunk_bytes u32
    meta    meta_len  msgpack array: namespace, block hash, parent hash, token ids,
                      session id, workload, created_at

The payload chunks are raw bytes (no copy on the way in or out). The header is
written after the chunks and every read checks the whole payload against the
header's checksum, so a torn write, a chunk evicted by Redis, a replace racing
a read, or bytes changed inside Redis are a miss, never served.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgspec
import xxhash

from kvstore.types import BlockKey, BlockMeta, Workload

__all__ = ["MAGIC", "PREFIX", "BadValue", "Header", "KeyNames", "decode_header", "encode_header"]

MAGIC = b"KVSR"
VERSION = 1
PREFIX = struct.Struct("<4sHHIQQQI")
_MAX_META = 16 << 20


class BadValue(Exception):
    """A header that is not intact (internal: the tier turns it into its own errors)."""


@dataclass(frozen=True, slots=True)
class Header:
    meta: BlockMeta
    chunk_bytes: int

    @property
    def chunks(self) -> int:
        return chunk_count(self.meta.size, self.chunk_bytes)


def chunk_count(size: int, chunk_bytes: int) -> int:
    return max(1, -(-size // chunk_bytes))


class KeyNames:
    """Key names for one prefix; namespace tags are cached (a few namespaces, many calls)."""

    __slots__ = ("_prefix", "_tags")

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix.encode()
        self._tags: dict[str, bytes] = {}

    def base(self, key: BlockKey) -> bytes:
        """``<prefix>:{<tag>.<hash>}:`` - append ``h`` or a chunk number."""
        tag = self._tags.get(key.namespace)
        if tag is None:
            tag = self._tags[key.namespace] = xxhash.xxh3_64_hexdigest(
                key.namespace.encode()).encode()
        return b"%s:{%s.%s}:" % (self._prefix, tag, key.block_hash.hex().encode())

    def header(self, key: BlockKey) -> bytes:
        return self.base(key) + b"h"

    def chunks(self, key: BlockKey, n: int, start: int = 0) -> list[bytes]:
        base = self.base(key)
        return [base + str(i).encode() for i in range(start, n)]

    def pattern(self) -> bytes:
        """SCAN pattern matching every key under this prefix."""
        return self._prefix + b":*"


_META = msgspec.msgpack.Encoder()
_META_DEC = msgspec.msgpack.Decoder(
    tuple[str, bytes, bytes | None, list[int], str, str, float])


def encode_header(meta: BlockMeta, checksum: int, chunk_bytes: int) -> bytes:
    body = _META.encode((meta.key.namespace, meta.key.block_hash, meta.parent_hash,
                         meta.token_ids, meta.session_id, str(meta.workload), meta.created_at))
    prefix = PREFIX.pack(MAGIC, VERSION, 0, len(body), meta.size, checksum,
                         xxhash.xxh3_64_intdigest(body), chunk_bytes)
    return prefix + body


def decode_header(buf: bytes) -> Header:
    """Parse and check a header (metadata checksum included); raise :class:`BadValue`."""
    if len(buf) < PREFIX.size:
        raise BadValue(f"header shorter than {PREFIX.size} bytes")
    magic, version, _flags, meta_len, size, checksum, meta_sum, chunk_bytes = \
        PREFIX.unpack_from(buf)
    if magic != MAGIC:
        raise BadValue(f"bad magic {magic!r}")
    if version != VERSION:
        raise BadValue(f"unsupported header version {version}")
    if meta_len > _MAX_META or len(buf) != PREFIX.size + meta_len:
        raise BadValue(f"header of {len(buf)} bytes does not hold {meta_len} bytes of metadata")
    if size <= 0 or chunk_bytes <= 0:
        raise BadValue(f"implausible size {size} / chunk size {chunk_bytes}")
    body = memoryview(buf)[PREFIX.size:]
    if xxhash.xxh3_64_intdigest(body) != meta_sum:
        raise BadValue("metadata checksum mismatch")
    try:
        ns, block_hash, parent, tokens, session, workload, created = _META_DEC.decode(body)
        meta = BlockMeta(key=BlockKey(ns, block_hash), parent_hash=parent,
                         token_ids=tuple(tokens), size=size, checksum=checksum,
                         session_id=session, workload=Workload(workload), created_at=created)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise BadValue(f"undecodable metadata: {exc}") from exc
    return Header(meta, chunk_bytes)
