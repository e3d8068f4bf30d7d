"""On-disk format (version 2) of the disk tier: segments, records, footers, kill lists.

Files under the tier's root (``<id>`` is the segment id, 16 hex digits; ids only
grow, a file name is never reused)::

    <id>.seg    records, appended in place; preallocated, truncated to its end when sealed
    <id>.idx    footer of a sealed segment: every record in it, with its metadata
    <id>.kill   kill list: offsets of records of <id>.seg deleted or replaced since
    *.tmp       a footer being written (removed at start)

Segment file (little-endian)::

    page 0      SEG_HEADER  magic "KVSG", version u16, flags u16, reserved u32,
                            segment id u64, nonce u64, size u64, xxh3-64 of the above
    records     from offset 4096, each on a 4096-byte boundary:
      header    RECORD      magic "KVRB", version u16, kind u16, nonce u64, offset u64,
                            record length u64, payload length u64, meta length u32,
                            reserved u32, payload xxh3-64 u64,
                            xxh3-64 of these 56 bytes and the meta
      meta      msgpack [namespace, hash, parent, token ids, session, workload, created,
                token count]
      payload
      padding   zeros up to the next 4096-byte boundary

A record is intact when its header names this segment's nonce and its own
offset and its header checksum matches; its payload is intact when the payload
checksum matches. The nonce is random per segment and lives only in the files,
so bytes inside a payload can never pass for a record of the segment.

Footer (``.idx``): a 48-byte prefix (magic "KVIX", version u16, flags u16,
segment id u64, nonce u64, entry count u64, body length u64, body xxh3-64 u64)
and a msgpack body ``[namespaces, entries]``, each entry
``[offset, record length, payload length, payload xxh3-64, namespace index, hash,
parent, token ids, session, workload, created, token count]``.

Kill list (``.kill``): 16-byte entries (record offset u64, xxh3-64 of the offset
seeded with the nonce); it ends at the first all-zero entry.
"""

from __future__ import annotations

import struct

import msgspec
import xxhash

from kvstore.types import BlockKey, BlockMeta, Workload

__all__ = [
    "ALIGN",
    "FOOTER",
    "KILL",
    "RECORD",
    "SEG_HEADER",
    "VERSION",
    "BadSegment",
    "Footer",
    "FooterEntry",
    "RecordMeta",
    "align",
    "decode_footer",
    "decode_record_header",
    "encode_footer",
    "encode_kill",
    "encode_record_header",
    "encode_segment_header",
    "decode_segment_header",
    "decode_tokens",
    "encode_tokens",
    "entry_meta",
    "kill_check",
    "record_meta_of",
]

VERSION = 2
ALIGN = 4096
SEG_MAGIC, REC_MAGIC, IDX_MAGIC = b"KVSG", b"KVRB", b"KVIX"
KIND_BLOCK = 1
SEG_HEADER = struct.Struct("<4sHHIQQQQ")
RECORD = struct.Struct("<4sHHQQQQIIQQ")
FOOTER = struct.Struct("<4sHHQQQQQ")
KILL = struct.Struct("<QQ")
_MAX_META = 64 << 20


class BadSegment(Exception):
    """A segment, footer, kill list or record that is not intact (internal)."""


class RecordMeta(msgspec.Struct, array_like=True, frozen=True):
    ns: str
    hash: bytes
    parent: bytes | None
    tokens: tuple[int, ...]
    session: str
    workload: str
    created: float
    num_tokens: int = 0


class FooterEntry(msgspec.Struct, array_like=True):
    offset: int
    record_len: int
    payload_len: int
    checksum: int
    ns: int
    hash: bytes
    parent: bytes | None
    #: The msgpack array of token ids, decoded only when a BlockMeta is built (a
    #: restart then holds no int objects for blocks it has not handed out yet).
    tokens: msgspec.Raw
    session: str
    workload: str
    created: float
    num_tokens: int = 0


class Footer(msgspec.Struct, array_like=True):
    namespaces: list[str]
    entries: list[FooterEntry]


_META_ENC = msgspec.msgpack.Encoder()
_META_DEC = msgspec.msgpack.Decoder(RecordMeta)
_FOOTER_DEC = msgspec.msgpack.Decoder(Footer)
_WORKLOADS = {w.value: w for w in Workload}
_TOKENS_DEC = msgspec.msgpack.Decoder(tuple[int, ...])


def encode_tokens(tokens: tuple[int, ...] | list[int]) -> msgspec.Raw:
    return msgspec.Raw(_META_ENC.encode(tokens))


def decode_tokens(raw: msgspec.Raw) -> tuple[int, ...]:
    return _TOKENS_DEC.decode(raw)


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# ---- segment header ---------------------------------------------------------------
def encode_segment_header(seg_id: int, nonce: int, size: int) -> bytes:
    head = SEG_HEADER.pack(SEG_MAGIC, VERSION, 0, 0, seg_id, nonce, size, 0)[:-8]
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


def decode_segment_header(buf: bytes | memoryview) -> tuple[int, int, int]:
    """(segment id, nonce, size) of an intact segment header."""
    if len(buf) < SEG_HEADER.size:
        raise BadSegment("shorter than a segment header")
    magic, version, _f, _r, seg_id, nonce, size, check = SEG_HEADER.unpack_from(buf)
    if magic != SEG_MAGIC:
        raise BadSegment(f"bad segment magic {bytes(magic)!r}")
    if xxhash.xxh3_64_intdigest(bytes(buf[: SEG_HEADER.size - 8])) != check:
        raise BadSegment("segment header checksum mismatch")
    if version != VERSION:
        raise BadSegment(f"unsupported segment version {version} (this build reads {VERSION})")
    return seg_id, nonce, size


# ---- records ----------------------------------------------------------------------
def record_meta_of(meta: BlockMeta) -> bytes:
    return _META_ENC.encode(RecordMeta(
        meta.key.namespace, meta.key.block_hash, meta.parent_hash, tuple(meta.token_ids),
        meta.session_id, str(meta.workload), meta.created_at, meta.num_tokens))


def encode_record_header(nonce: int, offset: int, record_len: int, payload_len: int,
                         checksum: int, meta: bytes) -> bytes:
    fixed = RECORD.pack(REC_MAGIC, VERSION, KIND_BLOCK, nonce, offset, record_len, payload_len,
                        len(meta), 0, checksum, 0)[:-8]
    head = xxhash.xxh3_64_intdigest(fixed + meta)
    return fixed + struct.pack("<Q", head)


def decode_record_header(buf: bytes | memoryview, nonce: int, offset: int
                         ) -> tuple[int, int, int, int]:
    """(record length, payload length, meta length, payload checksum) of the fixed
    header at ``buf[0:64]``; the header checksum is checked by :func:`check_record_meta`."""
    magic, version, kind, r_nonce, r_offset, rec_len, pay_len, meta_len, _r, checksum, _h = (
        RECORD.unpack_from(buf))
    if magic != REC_MAGIC or r_nonce != nonce or r_offset != offset:
        raise BadSegment(f"no record header at offset {offset}")
    if version != VERSION or kind != KIND_BLOCK:
        raise BadSegment(f"record at {offset}: unsupported version {version} / kind {kind}")
    if meta_len > _MAX_META or rec_len != align(RECORD.size + meta_len + pay_len):
        raise BadSegment(f"record at {offset}: implausible lengths")
    return rec_len, pay_len, meta_len, checksum


def check_record_meta(buf: bytes | memoryview, meta_len: int) -> RecordMeta:
    """Verify the header checksum over ``buf[0:64 + meta_len]``; decode the meta."""
    (head,) = struct.unpack_from("<Q", buf, RECORD.size - 8)
    end = RECORD.size + meta_len
    digest = xxhash.xxh3_64()
    digest.update(buf[: RECORD.size - 8])
    digest.update(buf[RECORD.size : end])
    if digest.intdigest() != head:
        raise BadSegment("record header checksum mismatch")
    try:
        return _META_DEC.decode(buf[RECORD.size : end])
    except msgspec.DecodeError as exc:
        raise BadSegment(f"undecodable record metadata: {exc}") from exc


# ---- footers ----------------------------------------------------------------------
def encode_footer(seg_id: int, nonce: int, footer: Footer) -> bytes:
    body = msgspec.msgpack.encode(footer)
    prefix = FOOTER.pack(IDX_MAGIC, VERSION, 0, seg_id, nonce, len(footer.entries), len(body),
                         xxhash.xxh3_64_intdigest(body))
    return prefix + body


def decode_footer(buf: bytes | memoryview, seg_id: int, nonce: int) -> Footer:
    if len(buf) < FOOTER.size:
        raise BadSegment("footer shorter than its prefix")
    magic, version, _f, f_seg, f_nonce, count, body_len, check = FOOTER.unpack_from(buf)
    if magic != IDX_MAGIC or version != VERSION or f_seg != seg_id or f_nonce != nonce:
        raise BadSegment("footer does not belong to this segment")
    body = buf[FOOTER.size :]
    if len(body) != body_len or xxhash.xxh3_64_intdigest(body) != check:
        raise BadSegment("footer checksum mismatch")
    try:
        footer = _FOOTER_DEC.decode(body)
    except msgspec.DecodeError as exc:
        raise BadSegment(f"undecodable footer: {exc}") from exc
    if len(footer.entries) != count:
        raise BadSegment("footer entry count mismatch")
    return footer


def entry_meta(e: FooterEntry, namespace: str) -> BlockMeta:
    return BlockMeta(BlockKey(namespace, e.hash), e.parent, _TOKENS_DEC.decode(e.tokens),
                     e.payload_len, e.checksum, e.session,
                     _WORKLOADS.get(e.workload, Workload.UNKNOWN), e.created, e.num_tokens)


# ---- kill lists -------------------------------------------------------------------
def kill_check(nonce: int, offset: int) -> int:
    return xxhash.xxh3_64_intdigest(offset.to_bytes(8, "little"), seed=nonce)


def encode_kill(nonce: int, offset: int) -> bytes:
    return KILL.pack(offset, kill_check(nonce, offset))
