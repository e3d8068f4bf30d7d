"""Restart of the disk tier: rebuild the index from footers, kill lists and scans.

For every ``<id>.seg`` in the root (in id order, so a later record of a key wins):

* the segment header must be intact (else the segment is dropped, logged);
* its footer, when intact, lists every record: no record is read. A segment
  without one (the active segment at a crash, or a footer lost) is scanned
  record by record: header checksum, metadata and payload checksum are all
  verified, torn or damaged records are counted and logged, regions a crash
  left half written are skipped to the next intact record; then its unused
  tail is truncated and a footer is written, so the next start reads it fast;
* its kill list removes the records deleted or replaced since.

What is verified at restart: every footer's checksum, that every record a
footer lists lies inside its segment file, every kill entry's check, and in
scanned segments every record in full. What is verified at first read:
the payload of records listed in footers (the tier checks header, key and
payload checksum on every read; a mismatch is DataCorruption and the block is
dropped and counted, never served).

Every directory entry that cannot be used (a directory, symlink, FIFO or device
where a segment, footer or kill list is expected; a damaged segment header; a
file of the previous one-file-per-block format) is skipped with a log line and
counted; nothing stops or blocks the start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvstore.tiers.disk.format import (
    ALIGN,
    REC_MAGIC,
    RECORD,
    BadSegment,
    Footer,
    FooterEntry,
    decode_record_header,
    encode_tokens,
)
from kvstore.tiers.disk.segment import (
    SegmentFile,
    aligned,
    open_segment,
    read_exact,
    read_footer,
    read_kills,
    verify_record,
    write_footer,
)

__all__ = ["RecoveredSegment", "RecoveryReport", "live_records", "recover_root"]

log = logging.getLogger(__name__)

_SEG = re.compile(r"^([0-9a-f]{16})\.(seg|idx|kill)$")
_SCAN_CHUNK = 8 << 20
_MAGIC_U32 = int.from_bytes(REC_MAGIC, "little")


@dataclass(eq=False)
class RecoveredSegment:
    file: SegmentFile
    footer: Footer
    killed: set[int]
    kills: int
    has_footer: bool  # on disk now (read, or written after the scan)


@dataclass
class RecoveryReport:
    """What a start found; the tier keeps the counts (``skipped``, ``damaged``)."""

    segments: list[RecoveredSegment] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "name: why"
    damaged: int = 0  # records, kill entries and segments dropped for failed checks
    torn: int = 0  # half-written regions skipped in scanned segments
    scanned: int = 0  # segments without a usable footer
    next_id: int = 1
    seconds: float = 0.0


def recover_root(root: Path, direct: bool, sync: bool, *, readonly: bool = False
                 ) -> RecoveryReport:
    """Read everything under ``root`` (blocking; run it in a thread). ``readonly``:
    an inspection that changes nothing (no leftover removed, no footer written; the
    caller closes the segments' fds)."""
    t0 = time.perf_counter()
    report = RecoveryReport()
    ids: set[int] = set()
    legacy = 0
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        name = entry.name
        m = _SEG.match(name)
        if m:
            ids.add(int(m.group(1), 16))
            report.next_id = max(report.next_id, int(m.group(1), 16) + 1)
            continue
        if name.endswith(".tmp"):
            if not readonly:
                _remove_leftover(entry.path, report)
        elif name.endswith(".kvb") or (len(name) == 2 and entry.is_dir(follow_symlinks=False)):
            legacy += 1
        else:
            _skip(report, name, "not a file of the disk tier")
    if legacy:
        _skip(report, f"{legacy} entries", "files of the previous on-disk format (one file per "
              "block) are not read by format 2; remove them to reclaim the space")
    for seg_id in sorted(ids):
        seg = _recover_segment(root, seg_id, direct, sync, report, readonly)
        if seg is not None:
            report.segments.append(seg)
    report.seconds = time.perf_counter() - t0
    return report


def _skip(report: RecoveryReport, name: str, why: str) -> None:
    report.skipped.append(f"{name}: {why}")
    log.warning("disk tier: skipped %s: %s", name, why)


def _remove_leftover(path: str, report: RecoveryReport) -> None:
    try:
        os.unlink(path)
    except IsADirectoryError:
        _skip(report, os.path.basename(path), "a directory named like a temp file")
    except OSError as exc:
        _skip(report, os.path.basename(path), f"leftover temp file not removed: {exc}")


def _recover_segment(root: Path, seg_id: int, direct: bool, sync: bool,
                     report: RecoveryReport, readonly: bool) -> RecoveredSegment | None:
    path = root / f"{seg_id:016x}.seg"
    try:
        file = open_segment(path, direct, readonly)
    except FileNotFoundError:  # a footer or kill list without its segment
        if not path.is_symlink():
            if not readonly:
                _orphans(root, seg_id, report)
            return None
        _skip(report, path.name, "a dangling symlink")
        return None
    except BadSegment as exc:
        if "not a regular file" in str(exc):
            _skip(report, path.name, str(exc))
            return None
        report.damaged += 1
        log.warning("disk tier: segment %s dropped: %s", path.name, exc)
        if not readonly:
            _remove_regular(root, seg_id)
        return None
    except OSError as exc:
        _skip(report, path.name, f"cannot open: {exc}")
        return None
    try:
        footer = read_footer(root, file)
        has_footer = True
        _drop_past_the_end(file, footer, report)
    except (BadSegment, OSError) as exc:
        if "not a regular file" in str(exc):
            _skip(report, f"{seg_id:016x}.idx", f"{exc}; scanning the segment instead")
        elif not isinstance(exc, FileNotFoundError):
            log.warning("disk tier: footer of %s unusable (%s); scanning the segment",
                        path.name, exc)
        footer, has_footer = _scan(file, report), False
        report.scanned += 1
        if readonly:
            return _with_kills(root, file, footer, False, report)
        # Cut the tail a crash left and write the footer the segment lacked.
        tail = max((e.offset + e.record_len for e in footer.entries), default=ALIGN)
        try:
            os.ftruncate(file.fd, tail)
            file.size = tail
            write_footer(root, file, footer, sync)
            has_footer = True
        except OSError as exc:
            log.warning("disk tier: could not seal scanned segment %s: %s", path.name, exc)
    return _with_kills(root, file, footer, has_footer, report)


def _with_kills(root: Path, file: SegmentFile, footer: Footer, has_footer: bool,
                report: RecoveryReport) -> RecoveredSegment:
    path = root / f"{file.seg_id:016x}.seg"
    try:
        killed, kills, bad = read_kills(root, file)
    except (BadSegment, OSError) as exc:
        _skip(report, f"{file.seg_id:016x}.kill", str(exc))
        killed, kills, bad = set(), 0, 0
    if bad:
        report.damaged += bad
        log.warning("disk tier: %d damaged entries in the kill list of %s", bad, path.name)
    return RecoveredSegment(file, footer, killed, kills, has_footer)


def _drop_past_the_end(file: SegmentFile, footer: Footer, report: RecoveryReport) -> None:
    """Records a footer lists beyond the end of a (truncated) segment file are gone."""
    inside = [e for e in footer.entries if e.offset + e.record_len <= file.size]
    if len(inside) < len(footer.entries):
        lost = len(footer.entries) - len(inside)
        report.damaged += lost
        log.warning("disk tier: segment %016x is cut short (%d bytes): %d records past its end "
                    "dropped", file.seg_id, file.size, lost)
        footer.entries = inside


def _orphans(root: Path, seg_id: int, report: RecoveryReport) -> None:
    for suffix in (".idx", ".kill"):
        p = root / f"{seg_id:016x}{suffix}"
        if p.exists() or p.is_symlink():
            if p.is_file() and not p.is_symlink():
                p.unlink()
                log.info("disk tier: removed %s (its segment is gone)", p.name)
            else:
                _skip(report, p.name, "not a regular file")


def _remove_regular(root: Path, seg_id: int) -> None:
    for suffix in (".seg", ".idx", ".kill"):
        p = root / f"{seg_id:016x}{suffix}"
        if p.is_file() and not p.is_symlink():
            with contextlib.suppress(OSError):
                p.unlink()


class _Window:
    """Sequential reads of a segment in large aligned chunks (one read per chunk,
    not per record); ``get`` returns bytes ``[pos, pos + n)`` (fewer at the end)."""

    def __init__(self, file: SegmentFile):
        self.file = file
        self.start = 0
        self.buf = memoryview(b"")

    def get(self, pos: int, n: int) -> memoryview:
        end = min(pos + n, self.file.size)
        if not (self.start <= pos and end <= self.start + len(self.buf)):
            length = max(end - pos, min(_SCAN_CHUNK, self.file.size - pos))
            buf = aligned(-(-length // ALIGN) * ALIGN)
            got = read_exact(self.file.fd, buf, pos)
            self.start, self.buf = pos, buf[:got]
        return self.buf[pos - self.start : end - self.start]


def _scan(file: SegmentFile, report: RecoveryReport) -> Footer:
    """Every intact record of a segment without a footer, verified in full."""
    namespaces: dict[str, int] = {}
    entries: list[FooterEntry] = []
    damaged = torn = 0
    pos, size = ALIGN, file.size
    window = _Window(file)
    while pos < size:
        page = window.get(pos, ALIGN)
        start = pos
        if len(page) >= RECORD.size and bytes(page[:4]) == REC_MAGIC:
            try:
                rec_len = decode_record_header(page, file.nonce, pos)[0]
            except BadSegment:
                rec_len = 0
            if rec_len:
                try:
                    meta, payload = verify_record(window.get(pos, rec_len), file.nonce, pos,
                                                  rec_len)
                except BadSegment as exc:
                    damaged += 1
                    log.warning("disk tier: segment %016x: damaged record at %d dropped: %s",
                                file.seg_id, pos, exc)
                else:
                    ns = namespaces.setdefault(meta.ns, len(namespaces))
                    entries.append(FooterEntry(
                        pos, rec_len, payload.nbytes, _checksum(page), ns, meta.hash,
                        meta.parent, encode_tokens(meta.tokens), meta.session, meta.workload,
                        meta.created, meta.num_tokens))
                pos += rec_len
                continue
            damaged += 1  # the magic, but not a header of this segment at this offset
            start = pos + ALIGN
        pos, dirty = _next_candidate(file, start, size)
        torn += 1 if dirty or pos < size else 0  # garbage, or a hole before a record
    if damaged or torn:
        log.warning("disk tier: segment %016x scanned: %d records kept, %d damaged records "
                    "and %d half-written regions dropped", file.seg_id, len(entries), damaged,
                    torn)
    report.damaged += damaged
    report.torn += torn
    return Footer(list(namespaces), entries)


def _checksum(page: memoryview) -> int:
    return int(RECORD.unpack_from(page)[9])


def _next_candidate(file: SegmentFile, start: int, size: int) -> tuple[int, int]:
    """(offset of the next page that starts with the record magic or ``size``,
    1 if a non-zero byte was skipped on the way else 0)."""
    dirty = 0
    pos = start
    while pos < size:
        try:  # skip what was never written (preallocated, unwritten: a hole to SEEK_DATA)
            pos = max(pos, os.lseek(file.fd, pos, os.SEEK_DATA) // ALIGN * ALIGN)
        except OSError:  # ENXIO: nothing but holes up to the end
            return size, dirty
        if pos >= size:
            break
        n = min(_SCAN_CHUNK, size - pos)
        buf = aligned(n)
        got = read_exact(file.fd, buf, pos)
        if got <= 0:
            break
        words = np.frombuffer(buf[: got - got % ALIGN], dtype="<u4").reshape(-1, ALIGN // 4)
        hits = np.flatnonzero(words[:, 0] == _MAGIC_U32)
        upto = int(hits[0]) if len(hits) else len(words)
        if not dirty and words[:upto].any():
            dirty = 1
        if len(hits):
            return pos + upto * ALIGN, dirty
        pos += got - got % ALIGN
        if got % ALIGN or got < n:
            break
    return size, dirty


def live_records(report: RecoveryReport) -> dict[tuple[str, bytes], FooterEntry]:
    """(namespace, hash) -> the record a restart would serve for it (kills applied,
    the newest record of a key wins), from a report of :func:`recover_root`."""
    live: dict[tuple[str, bytes], FooterEntry] = {}
    for seg in report.segments:
        for e in seg.footer.entries:
            if e.offset not in seg.killed:
                live[(seg.footer.namespaces[e.ns], e.hash)] = e
    return live
