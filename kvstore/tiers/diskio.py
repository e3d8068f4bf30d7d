"""Blocking file I/O of the disk tier (run in its thread pool, never on the event loop)."""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import xxhash

from kvstore.tiers.diskformat import (
    PREFIX,
    BadBlockFile,
    decode_meta,
    decode_prefix,
    encode_header,
    file_name,
)
from kvstore.types import BlockKey, BlockMeta

__all__ = ["ChangedPayload", "Entry", "read_block", "scan", "unlink", "write_block"]

TMP = ".tmp"
SUFFIX = ".kvb"


@dataclass(frozen=True, slots=True)
class Entry:
    meta: BlockMeta
    path: Path


class ChangedPayload(Exception):
    """The bytes handed to put no longer match the checksum the caller computed."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_block(root: Path, path: Path, meta: BlockMeta, payload: memoryview, sync: bool) -> int:
    checksum = xxhash.xxh3_64_intdigest(payload)
    if meta.checksum and meta.checksum != checksum:
        raise ChangedPayload(f"payload xxh3-64 {checksum:#x} != meta.checksum {meta.checksum:#x}")
    header = encode_header(meta, checksum)
    if not path.parent.is_dir():
        path.parent.mkdir(exist_ok=True)
        if sync:
            _fsync_dir(root)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TMP}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            _write_all(fd, header)
            _write_all(fd, payload)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise
    if sync:
        _fsync_dir(path.parent)
    return checksum


def read_block(path: Path, key: BlockKey) -> memoryview:
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    header = decode_prefix(view[:got])
    if got != header.file_size:
        raise BadBlockFile(f"file is {got} bytes, header says {header.file_size}")
    meta = decode_meta(header, view[PREFIX.size : header.payload_offset])
    if meta.key != key:
        raise BadBlockFile(f"file holds block {meta.key}, not {key}")
    payload = view[header.payload_offset :]
    if xxhash.xxh3_64_intdigest(payload) != header.checksum:
        raise BadBlockFile("payload checksum mismatch")
    return payload


def unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _check_file(path: Path) -> Entry:
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        header = decode_prefix(f.read(PREFIX.size))
        meta = decode_meta(header, f.read(header.meta_len))
    if size != header.file_size:
        raise BadBlockFile(f"file is {size} bytes, header says {header.file_size}")
    if path.name != file_name(meta.key):
        raise BadBlockFile(f"file name does not match block {meta.key}")
    return Entry(meta, path)


def scan(root: Path) -> list[Entry]:
    found: list[Entry] = []
    for sub in sorted(root.iterdir()):
        if not sub.is_dir() or len(sub.name) != 2:
            continue
        for path in sorted(sub.iterdir()):
            if path.name.endswith(TMP):
                unlink(path)
            elif path.name.endswith(SUFFIX):
                try:
                    found.append(_check_file(path))
                except BadBlockFile:
                    unlink(path)
    return found
