"""Who owns a DRAM segment, across restarts and pid reuse; removing dead servers' ones.

A segment a server leaves behind when it dies (``kill -9``, a crash, an OOM kill)
keeps its memory until someone unlinks it. A pid says nothing about who owns it: in
a container the server is PID 1 at every start, and in Kubernetes the ``/dev/shm``
``emptyDir`` outlives a container restart. Two things do:

* **The data directory's owner record**, ``<data_dir>/<tier>.segments``: the server
  holds an exclusive ``flock`` on it for its whole life and lists there, before
  creating each one, the segments it makes. A server starting on that data
  directory takes the lock (refused while a live server holds it: two servers on
  one data directory would share its disk tier too), unlinks every segment its
  predecessor listed, whatever pid either of them had, and lists its own.
* **The segment's own flock** (:func:`kvstore.tiers.shm.segment_is_live`): the
  owner holds it while it lives, in whatever PID namespace. At start a server also
  removes every ``<prefix>_*`` segment whose owner is gone (a dead server of some
  other data directory) unless it is younger than :data:`CREATION_GRACE_S` (its
  owner may be between creating and locking it). A live server's segment is never
  touched, whichever data directory and container it runs from.

Segments named the way older versions named them, ``<prefix>_<pid>_<8 hex>_<n>``,
carry no flock: those go only when no process has that pid here (the older rule),
so a server of an older version running on the same host keeps its segment.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from kvstore.errors import TierUnavailable
from kvstore.tiers.shm import segment_is_live

__all__ = ["CREATION_GRACE_S", "SegmentOwner", "reap_stale_segments"]

log = logging.getLogger(__name__)

#: A segment younger than this is never reaped by the host-wide scan.
CREATION_GRACE_S = 10.0
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_LEGACY = re.compile(r"_([0-9]+)_[0-9a-f]{8}_[0-9]+")


class SegmentOwner:
    """The flock'd record of the segments the server on one data directory owns."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def claim(cls, data_dir: Path, tier: str = "dram") -> SegmentOwner:
        """Lock ``<data_dir>/<tier>.segments``; TierUnavailable while another server has it."""
        path = Path(data_dir) / f"{tier}.segments"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise TierUnavailable(
                f"tier {tier!r}: cannot open its segment record {str(path)!r}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise TierUnavailable(
                f"data_dir {str(data_dir)!r} is in use by another kvstore server (it holds "
                f"{str(path)!r}); give each server its own data_dir") from exc
        return cls(path, fd)

    def recorded(self) -> list[str]:
        """The segment names the record lists (a predecessor's, right after claim)."""
        raw = os.pread(self._live_fd(), 1 << 16, 0).decode("utf-8", "replace")
        return [n for n in raw.split() if _NAME.fullmatch(n)]

    def reclaim(self, shm_dir: str = "/dev/shm") -> list[str]:
        """Unlink every segment the predecessor on this data directory recorded.

        Its lock is ours, so it is dead (or stopped): its segments are garbage,
        whatever pid it had. Returns the names removed."""
        reaped = []
        for name in self.recorded():
            try:
                os.unlink(os.path.join(shm_dir, name))
            except FileNotFoundError:
                continue  # it stopped cleanly, or a host-wide scan removed it
            except OSError as exc:
                log.warning("cannot remove shared-memory segment %s of the previous server "
                            "on this data_dir: %s", name, exc)
                continue
            reaped.append(name)
        if reaped:
            log.info("removed %d shared-memory segments of the previous server on %s: %s",
                     len(reaped), self.path.parent, reaped)
        self.record(())
        return reaped

    def record(self, names: Sequence[str]) -> None:
        """Make ``names`` the record (durably: a crash right after must find them)."""
        fd = self._live_fd()
        data = "".join(f"{n}\n" for n in names).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)

    def close(self) -> None:
        """Clear the record (the segments were destroyed) and release the lock."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.record(())
        os.close(self._fd)
        self._fd = None

    def _live_fd(self) -> int:
        if self._fd is None:
            raise TierUnavailable(f"segment record {str(self.path)!r} is closed")
        return self._fd


def reap_stale_segments(prefix: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink ``<prefix>_*`` segments whose owner died (its flock is gone).

    A live owner's segment is never touched (it holds its flock), nor one younger
    than :data:`CREATION_GRACE_S`, nor one this process cannot open."""
    reaped: list[str] = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return reaped
    now = time.time()
    for name in names:
        if not name.startswith(prefix + "_"):
            continue
        path = os.path.join(shm_dir, name)
        try:
            if now - os.stat(path, follow_symlinks=False).st_ctime < CREATION_GRACE_S:
                continue
        except OSError:
            continue
        legacy = _LEGACY.fullmatch(name[len(prefix):])
        if legacy is not None:
            if _pid_alive(int(legacy.group(1))):
                continue
        elif segment_is_live(path) is not False:
            continue
        try:
            os.unlink(path)
            reaped.append(name)
        except OSError:
            pass
    if reaped:
        log.info("removed %d shared-memory segments of dead servers: %s", len(reaped), reaped)
    return reaped


def _pid_alive(pid: int) -> bool:
    """Whether a process of that pid may exist here (an older version's owner)."""
    if pid == os.getpid():
        return True  # this process (or a predecessor with the same pid): not to be judged
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
