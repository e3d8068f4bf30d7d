"""Blocking I/O on the disk tier's segment files (run in its threads, never on the loop).

Record writes and reads use ``O_DIRECT`` where the filesystem allows it (the data
goes from an aligned buffer straight to the device: no page-cache copy, no
double caching of what the DRAM tier already caches); footers and kill lists
are small and go through the page cache. The format is in
:mod:`kvstore.tiers.disk.format`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kvstore.tiers.disk.format import (
    ALIGN,
    KILL,
    RECORD,
    BadSegment,
    Footer,
    RecordMeta,
    check_record_meta,
    decode_footer,
    decode_record_header,
    decode_segment_header,
    encode_footer,
    encode_kill,
    encode_segment_header,
    kill_check,
)

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "SegmentFile",
    "aligned",
    "create_segment",
    "default_segment_bytes",
    "fsync_dir",
    "lift_fd_limit",
    "make_private_dir",
    "open_regular",
    "open_segment",
    "punch",
    "read_footer",
    "read_kills",
    "read_record",
    "remove_segment",
    "seg_path",
    "verify_record",
    "write_at",
    "write_footer",
    "write_kills",
]

_FULL = (errno.ENOSPC, errno.EDQUOT)
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
#: Kill lists grow in chunks of this many bytes (4096 entries), preallocated so a
#: delete on a full filesystem can still be recorded.
KILL_CHUNK = 64 << 10
#: Block payloads are the users' KV cache (derived from their prompts): segment
#: files, footers and kill lists are the owner's only, and so is their directory.
FILE_MODE = 0o600
DIR_MODE = 0o700


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and its parents) with the leaf owner-only; a directory that
    already exists is narrowed to owner-only too (one created by an older version)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) & ~DIR_MODE:
        try:
            path.chmod(DIR_MODE)
        except OSError as exc:  # not ours (a volume's mount point), read-only, ...
            logging.getLogger(__name__).warning(
                "cannot make %s owner-only (%s); its files are still 0600", path, exc)


@dataclass(eq=False, slots=True)
class SegmentFile:
    seg_id: int
    nonce: int
    size: int
    fd: int
    direct: bool


def lift_fd_limit() -> None:
    """Every segment keeps a file descriptor open: raise the soft limit to the hard one."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # pragma: no cover - a locked-down host
        logging.getLogger(__name__).info("disk tier: open-file limit left as it is: %s", exc)


def default_segment_bytes(capacity_bytes: int) -> int:
    """A power of two near capacity / 64, between 4 MiB and 1 GiB."""
    size = 4 << 20
    while size < (1 << 30) and size * 64 < capacity_bytes:
        size *= 2
    return size


def seg_path(root: Path, seg_id: int, suffix: str) -> Path:
    return root / f"{seg_id:016x}{suffix}"


def aligned(n: int) -> memoryview:
    """A writable, ``ALIGN``-aligned buffer of ``n`` bytes (not zeroed)."""
    raw = np.empty(n + ALIGN, dtype=np.uint8)
    shift = -raw.ctypes.data % ALIGN
    return memoryview(raw[shift : shift + n])  # type: ignore[arg-type]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_regular(path: Path, flags: int) -> int:
    """Open ``path`` only if it is a regular file: never follows a symlink, never
    blocks on a FIFO; raises BadSegment naming what it found instead."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise BadSegment(f"not a regular file ({os.strerror(exc.errno)})") from exc
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BadSegment(f"not a regular file (mode {stat.filemode(mode)})")
    return fd


def _open_data(path: Path, direct: bool, create: bool = False) -> tuple[int, bool]:
    flags = os.O_RDWR | os.O_CLOEXEC | ((os.O_CREAT | os.O_EXCL) if create else 0)
    if direct:
        try:
            return os.open(path, flags | os.O_DIRECT, FILE_MODE), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this filesystem has no O_DIRECT
                raise
    return os.open(path, flags, FILE_MODE), False


def _preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in _FULL:
            raise
        os.ftruncate(fd, size)  # not enough room to reserve: writes find out block by block


def create_segment(root: Path, seg_id: int, size: int, direct: bool, sync: bool) -> SegmentFile:
    """A new, preallocated segment with its header written (and synced)."""
    path = seg_path(root, seg_id, ".seg")
    nonce = secrets.randbits(64)
    fd, direct = _open_data(path, direct, create=True)
    try:
        _preallocate(fd, size)
        page = aligned(ALIGN)
        page[:] = b"\0" * ALIGN
        head = encode_segment_header(seg_id, nonce, size)
        page[: len(head)] = head
        write_at(fd, page, 0)
        _grow_kills(root, seg_id, 0)
        if sync:
            os.fsync(fd)
            fsync_dir(root)
    except BaseException:
        os.close(fd)
        remove_segment(root, seg_id)
        raise
    return SegmentFile(seg_id, nonce, size, fd, direct)


def open_segment(path: Path, direct: bool, readonly: bool = False) -> SegmentFile:
    """Open an existing segment (for reading and writing unless ``readonly``);
    raises BadSegment."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        head = os.pread(fd, ALIGN, 0)
        seg_id, nonce, _size = decode_segment_header(head)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if path.name != f"{seg_id:016x}.seg":
        raise BadSegment(f"header names segment {seg_id:016x}")
    if readonly:
        return SegmentFile(seg_id, nonce, size, open_regular(path, os.O_RDONLY), False)
    fd, direct = _open_data(path, direct)
    return SegmentFile(seg_id, nonce, size, fd, direct)


def write_at(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def read_exact(fd: int, buf: memoryview, offset: int) -> int:
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


def read_record(seg: SegmentFile, offset: int, record_len: int
                ) -> tuple[RecordMeta, memoryview]:
    """Read and verify one record: header, metadata, payload checksum. Raises
    BadSegment when any check fails (never returns unverified bytes)."""
    buf = aligned(record_len)
    got = read_exact(seg.fd, buf, offset)
    return verify_record(buf[:got], seg.nonce, offset, record_len)


def verify_record(buf: memoryview, nonce: int, offset: int, record_len: int | None = None
                  ) -> tuple[RecordMeta, memoryview]:
    """Check the record that ``buf`` (read from ``offset``) starts with: header,
    metadata, payload checksum; ``record_len`` if given must match. Returns its meta
    and a read-only view of its payload; raises BadSegment."""
    if len(buf) < RECORD.size:
        raise BadSegment(f"record at {offset} lies past the end of the segment")
    rec_len, pay_len, meta_len, checksum = decode_record_header(buf, nonce, offset)
    if (record_len is not None and rec_len != record_len) or (
            len(buf) < RECORD.size + meta_len + pay_len):
        raise BadSegment(f"record at {offset} is {rec_len} bytes, expected {record_len}, "
                         f"{len(buf)} readable")
    meta = check_record_meta(buf, meta_len)
    start = RECORD.size + meta_len
    payload = buf[start : start + pay_len]
    if xxhash.xxh3_64_intdigest(payload) != checksum:
        raise BadSegment(f"record at {offset}: payload checksum mismatch")
    return meta, payload.toreadonly()


def punch(fd: int, offset: int, length: int) -> bool:
    """Free the disk blocks of ``[offset, offset + length)``; False if unsupported."""
    if _fallocate is None:
        return False
    res = _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE,
                     ctypes.c_int64(offset), ctypes.c_int64(length))
    if res == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def _load_fallocate() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError, TypeError):  # pragma: no cover - non-glibc
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_fallocate = _load_fallocate()


def remove_segment(root: Path, seg_id: int) -> None:
    for suffix in (".seg", ".idx", ".kill"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg_path(root, seg_id, suffix))


# ---- footers ----------------------------------------------------------------------
def write_footer(root: Path, seg: SegmentFile, footer: Footer, sync: bool) -> None:
    final = seg_path(root, seg.seg_id, ".idx")
    tmp = final.with_name(final.name + ".tmp")
    data = encode_footer(seg.seg_id, seg.nonce, footer)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            write_at(fd, memoryview(data), 0)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync:
        fsync_dir(root)


def read_footer(root: Path, seg: SegmentFile) -> Footer:
    fd = open_regular(seg_path(root, seg.seg_id, ".idx"), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        buf = memoryview(bytearray(size))
        read_exact(fd, buf, 0)
    finally:
        os.close(fd)
    return decode_footer(buf, seg.seg_id, seg.nonce)


# ---- kill lists -------------------------------------------------------------------
def _grow_kills(root: Path, seg_id: int, used_bytes: int) -> None:
    """Make sure the kill list has preallocated room past ``used_bytes``."""
    path = seg_path(root, seg_id, ".kill")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        target = (used_bytes // KILL_CHUNK + 1) * KILL_CHUNK
        try:
            os.posix_fallocate(fd, 0, target)
        except OSError as exc:
            if exc.errno not in _FULL or used_bytes:
                raise
            os.posix_fallocate(fd, 0, ALIGN)  # a full disk: room for 256 kills at least
    finally:
        os.close(fd)


def write_kills(root: Path, seg: SegmentFile, first: int, offsets: list[int], sync: bool) -> None:
    """Write kill entries ``first, first+1, ...`` of ``seg``'s kill list (and sync it)."""
    data = b"".join(encode_kill(seg.nonce, off) for off in offsets)
    start = first * KILL.size
    if start // KILL_CHUNK != (start + len(data)) // KILL_CHUNK:
        _grow_kills(root, seg.seg_id, start + len(data))
    fd = open_regular(seg_path(root, seg.seg_id, ".kill"), os.O_WRONLY)
    try:
        write_at(fd, memoryview(data), start)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def read_kills(root: Path, seg: SegmentFile) -> tuple[set[int], int, int]:
    """(killed offsets, entries in the list, damaged entries). A missing list is empty."""
    path = seg_path(root, seg.seg_id, ".kill")
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        if path.is_symlink():
            raise BadSegment("a dangling symlink") from None
        return set(), 0, 0
    killed: set[int] = set()
    damaged = n = 0
    try:
        pos = 0
        while True:
            chunk = os.pread(fd, KILL_CHUNK, pos)
            entries = np.frombuffer(chunk[: len(chunk) // KILL.size * KILL.size], dtype="<u8")
            pairs = entries.reshape(-1, 2)
            zero = np.flatnonzero((pairs == 0).all(axis=1))
            end = int(zero[0]) if len(zero) else len(pairs)
            for off, check in pairs[:end].tolist():
                if kill_check(seg.nonce, off) == check:
                    killed.add(off)
                else:
                    damaged += 1
            n += end
            if end < len(pairs) or len(chunk) < KILL_CHUNK:
                break
            pos += len(chunk)
    finally:
        os.close(fd)
    return killed, n, damaged
