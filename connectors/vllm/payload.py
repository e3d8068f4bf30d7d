"""The bytes of one stored block: a fixed header, then every layer's KV.

::

    offset  size  field
    0       4     magic b"KVSV"
    4       2     format version (1)
    6       2     header length (64)
    8       8     layout digest: namespace + measured tensor layout (xxh3-64)
    16      1     block hash length
    17      7     reserved (zero)
    24      32    block hash (zero padded)
    56      8     body checksum (xxh3-64 of the body)
    64      ...   body: layer 0 block, layer 1 block, ... (logical order)

A block is loaded only if every field checks out: a payload stored under
another namespace or layout, for another hash, truncated or corrupted is a
load error (the engine recomputes), never wrong KV. The sidecar checksums
its own copies too; this header is the end-to-end check the connector owns.

The in-place forms (:func:`seal`, :func:`check_header`, :func:`body_matches`)
work on a payload where it lies (a shared-memory slot) without copying it:
xxh3-64 reads the body once, at several times memcpy speed, and releases the
GIL while it does.
"""

from __future__ import annotations

import struct

import xxhash

__all__ = [
    "HEADER_SIZE",
    "PayloadError",
    "body_matches",
    "check_header",
    "layout_digest",
    "pack_header",
    "seal",
    "unpack_body",
]

MAGIC = b"KVSV"
VERSION = 1
HEADER_SIZE = 64
_HEADER = struct.Struct("<4sHHQB7x32sQ")
assert _HEADER.size == HEADER_SIZE


class PayloadError(ValueError):
    """A stored payload that must not be loaded (says why)."""


def layout_digest(namespace: str, layout_signature: str) -> int:
    return xxhash.xxh3_64_intdigest(f"{namespace}\n{layout_signature}".encode())


def pack_header(digest: int, block_hash: bytes, body: memoryview | bytes) -> bytes:
    if len(block_hash) > 32:
        raise PayloadError(f"block hash longer than 32 bytes ({len(block_hash)})")
    checksum = xxhash.xxh3_64_intdigest(body)
    return _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, digest, len(block_hash), block_hash, checksum)


def seal(buf: memoryview, offset: int, length: int, digest: int, block_hash: bytes) -> None:
    """Write the header of the payload at ``buf[offset:offset + length]`` whose body is
    already in place (checksums the body where it lies)."""
    if len(block_hash) > 32:
        raise PayloadError(f"block hash longer than 32 bytes ({len(block_hash)})")
    if length < HEADER_SIZE:
        raise PayloadError(f"a payload of {length} bytes has no room for its header")
    body = buf[offset + HEADER_SIZE : offset + length]
    try:
        checksum = xxhash.xxh3_64_intdigest(body)
    finally:
        body.release()
    _HEADER.pack_into(
        buf, offset, MAGIC, VERSION, HEADER_SIZE, digest, len(block_hash), block_hash, checksum
    )


def check_header(
    buf: bytes | bytearray | memoryview,
    offset: int,
    length: int,
    digest: int,
    block_hash: bytes,
    body_size: int,
) -> int:
    """The body checksum the header of ``buf[offset:offset + length]`` promises, after
    checking that the payload belongs where it is loaded (reads 64 bytes)."""
    if length != HEADER_SIZE + body_size:
        raise PayloadError(f"payload is {length} bytes, expected {HEADER_SIZE + body_size}")
    magic, version, header_len, got_digest, hash_len, got_hash, checksum = _HEADER.unpack_from(
        buf, offset
    )
    if magic != MAGIC or version != VERSION or header_len != HEADER_SIZE:
        raise PayloadError(f"not a connector payload (magic {magic!r}, version {version})")
    if got_digest != digest:
        raise PayloadError("payload was stored under another namespace or KV layout")
    if got_hash[:hash_len] != block_hash:
        raise PayloadError("payload belongs to another block hash")
    return int(checksum)


def body_matches(
    buf: bytes | bytearray | memoryview, offset: int, length: int, checksum: int
) -> bool:
    """Whether the body of ``buf[offset:offset + length]`` has ``checksum`` (no copy)."""
    body = memoryview(buf)[offset + HEADER_SIZE : offset + length]
    try:
        return bool(xxhash.xxh3_64_intdigest(body) == checksum)
    finally:
        body.release()


def unpack_body(
    payload: bytes | bytearray | memoryview, digest: int, block_hash: bytes, body_size: int
) -> memoryview:
    """The body of ``payload`` after checking it belongs where it is loaded."""
    view = memoryview(payload).cast("B")
    checksum = check_header(view, 0, len(view), digest, block_hash, body_size)
    if not body_matches(view, 0, len(view), checksum):
        raise PayloadError("payload checksum mismatch (corrupted)")
    return view[HEADER_SIZE:]
