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
"""

from __future__ import annotations

import struct

import xxhash

__all__ = ["HEADER_SIZE", "PayloadError", "layout_digest", "pack_header", "unpack_body"]

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


def unpack_body(
    payload: bytes | bytearray | memoryview, digest: int, block_hash: bytes, body_size: int
) -> memoryview:
    """The body of ``payload`` after checking it belongs where it is loaded."""
    view = memoryview(payload).cast("B")
    if len(view) != HEADER_SIZE + body_size:
        raise PayloadError(f"payload is {len(view)} bytes, expected {HEADER_SIZE + body_size}")
    magic, version, header_len, got_digest, hash_len, got_hash, checksum = _HEADER.unpack(
        view[:HEADER_SIZE]
    )
    if magic != MAGIC or version != VERSION or header_len != HEADER_SIZE:
        raise PayloadError(f"not a connector payload (magic {magic!r}, version {version})")
    if got_digest != digest:
        raise PayloadError("payload was stored under another namespace or KV layout")
    if got_hash[:hash_len] != block_hash:
        raise PayloadError("payload belongs to another block hash")
    body = view[HEADER_SIZE:]
    if xxhash.xxh3_64_intdigest(body) != checksum:
        raise PayloadError("payload checksum mismatch (corrupted)")
    return body
