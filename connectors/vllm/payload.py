"""The bytes of one stored block: a fixed header, then every layer's KV.

::

    offset  size  field
    0       4     magic b"KVSV"
    4       2     format version (2)
    6       2     header length (64)
    8       8     layout digest: namespace + measured tensor layout (xxh3-64)
    16      1     block hash length
    17      7     reserved (zero)
    24      32    block hash (zero padded)
    56      8     reserved (zero; version 1 kept an xxh3-64 of the body here)
    64      ...   body: layer 0 block, layer 1 block, ... (logical order)

A block is loaded only if every field checks out and its bytes match their
checksum: a payload stored under another namespace or layout, for another
hash, truncated or corrupted is a load error (the engine recomputes), never
wrong KV.

One hash pass per byte each way: the header says where a payload belongs, the
sidecar's checksum says it is intact. A save writes header and body into the
slot and the client takes the slot's xxh3-64 once (header included), which
travels with the commit; the sidecar records it without reading the slot. A
load gets that checksum back with the slot (:attr:`SlotBuffer.checksum
<kvstore.client.SlotBuffer>`) and hashes the slot once while it copies
(:mod:`.loads`). A payload that came over gRPC was checked by the sidecar
before it sent it.

The in-place forms (:func:`seal`, :func:`check_header`, :func:`slot_matches`)
work on a payload where it lies (a shared-memory slot) without copying it:
xxh3-64 reads the slot once, at several times memcpy speed, and releases the
GIL while it does.
"""

from __future__ import annotations

import struct

import xxhash

__all__ = [
    "HEADER_SIZE",
    "PayloadError",
    "check_header",
    "layout_digest",
    "pack_header",
    "seal",
    "slot_matches",
    "unpack_body",
]

MAGIC = b"KVSV"
VERSION = 2
HEADER_SIZE = 64
_HEADER = struct.Struct("<4sHHQB7x32s8x")
assert _HEADER.size == HEADER_SIZE


class PayloadError(ValueError):
    """A stored payload that must not be loaded (says why)."""


def layout_digest(namespace: str, layout_signature: str) -> int:
    return xxhash.xxh3_64_intdigest(f"{namespace}\n{layout_signature}".encode())


def _check_hash(block_hash: bytes) -> None:
    if len(block_hash) > 32:
        raise PayloadError(f"block hash longer than 32 bytes ({len(block_hash)})")


def pack_header(digest: int, block_hash: bytes) -> bytes:
    _check_hash(block_hash)
    return _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, digest, len(block_hash), block_hash)


def seal(buf: memoryview, offset: int, length: int, digest: int, block_hash: bytes) -> None:
    """Write the header of the payload at ``buf[offset:offset + length]`` (64 bytes;
    the body is not read: its checksum is the slot's, taken once by the client)."""
    _check_hash(block_hash)
    if length < HEADER_SIZE:
        raise PayloadError(f"a payload of {length} bytes has no room for its header")
    _HEADER.pack_into(buf, offset, MAGIC, VERSION, HEADER_SIZE, digest, len(block_hash),
                      block_hash)


def check_header(
    buf: bytes | bytearray | memoryview,
    offset: int,
    length: int,
    digest: int,
    block_hash: bytes,
    body_size: int,
) -> None:
    """Check that the payload ``buf[offset:offset + length]`` belongs where it is
    loaded (reads 64 bytes; its integrity is :func:`slot_matches`')."""
    if length != HEADER_SIZE + body_size:
        raise PayloadError(f"payload is {length} bytes, expected {HEADER_SIZE + body_size}")
    magic, version, header_len, got_digest, hash_len, got_hash = _HEADER.unpack_from(buf, offset)
    if magic != MAGIC or version != VERSION or header_len != HEADER_SIZE:
        raise PayloadError(f"not a connector payload (magic {magic!r}, version {version})")
    if got_digest != digest:
        raise PayloadError("payload was stored under another namespace or KV layout")
    if got_hash[:hash_len] != block_hash:
        raise PayloadError("payload belongs to another block hash")


def slot_matches(
    buf: bytes | bytearray | memoryview, offset: int, length: int, checksum: int
) -> bool:
    """Whether the whole payload ``buf[offset:offset + length]`` (header and body) has
    ``checksum``, the sidecar's record of it (no copy)."""
    view = memoryview(buf)[offset : offset + length]
    try:
        return bool(xxhash.xxh3_64_intdigest(view) == checksum)
    finally:
        view.release()


def unpack_body(
    payload: bytes | bytearray | memoryview, digest: int, block_hash: bytes, body_size: int,
    checksum: int | None,
) -> memoryview:
    """The body of ``payload`` after checking it belongs where it is loaded and, with
    ``checksum`` (None: already checked by the sidecar), that it is intact."""
    view = memoryview(payload).cast("B")
    check_header(view, 0, len(view), digest, block_hash, body_size)
    if checksum is not None and not slot_matches(view, 0, len(view), checksum):
        raise PayloadError("payload checksum mismatch (corrupted)")
    return view[HEADER_SIZE:]
