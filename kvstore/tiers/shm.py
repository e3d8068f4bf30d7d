"""POSIX shared-memory segments: the owner side and the client side.

The owner (the DRAM tier in the server) creates, pre-faults and finally unlinks
each segment. A client on the same host maps it by name with
:func:`attach_segment` and must never unlink it.

Python 3.11 caveat: ``SharedMemory(name=...)`` registers the segment with the
process's ``multiprocessing.resource_tracker`` even when merely attaching (the
``track=False`` argument only arrived in 3.13), and the tracker *unlinks every
registered segment when the process exits*. An attaching client that does not
unregister therefore destroys the owner's segment on exit (and the tracker
warns about a "leaked" segment). :func:`attach_segment` unregisters right after
attaching; clients must use it (or do the same) instead of ``SharedMemory(name)``.
Then ``shm.close()`` (never ``unlink()``) when done.

Liveness: the owner holds an ``flock`` on each segment it created for as long as
it lives (the kernel drops it when the process dies, whatever its pid or PID
namespace), so :func:`segment_is_live` tells a live server's segment from one a
dead server left behind (:mod:`kvstore.tiers.shmowner` reaps those).

Mode and group: a segment is ``0600`` unless the owner asks for ``0660`` and,
optionally, a group, so a client running as another user of that group (the vLLM
container next to the sidecar) can map it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import sys
import threading
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import cast

import numpy as np

from kvstore.errors import TierUnavailable

__all__ = ["PAGE_SIZE", "SEGMENT_MODES", "attach_segment", "create_segment", "destroy_segment",
           "segment_is_live", "segment_name"]

log = logging.getLogger(__name__)

#: OS page size used for pre-faulting.
PAGE_SIZE = 4096
#: Modes a segment may have: the owner's only, or the owner's and its group's.
SEGMENT_MODES = (0o600, 0o660)


def segment_name(prefix: str, index: int) -> str:
    """A fresh, unguessable name, unique per server instance: ``<prefix>_<random>_<index>``.

    No pid in it: in a container the server is PID 1 at every start, so a pid says
    nothing about who owns a segment (the owner's ``flock`` does)."""
    return f"{prefix}_{secrets.token_hex(8)}_{index}"


#: Segments this process created (an in-process client must not unregister them).
_OWNED: set[str] = set()
_ATTACH_LOCK = threading.Lock()


def create_segment(name: str, size: int, *, prefault: bool = True, mode: int = 0o600,
                   gid: int | None = None) -> SharedMemory:
    """Create a segment of ``size`` bytes (owner side), lock it and fault its pages in.

    The owner's ``flock`` on the segment marks it live until this process closes it
    or dies. ``mode`` (one of :data:`SEGMENT_MODES`; ``SharedMemory`` creates 0600)
    and ``gid`` (None: the process's group) decide who else may map it: a
    co-located client must run as the same user, or in that group with 0660.
    Touching one byte per page makes the kernel back every page now, so the
    first write into a slot runs at memcpy speed instead of page-fault speed.
    """
    if mode not in SEGMENT_MODES:
        raise ValueError(f"segment mode must be one of {[oct(m) for m in SEGMENT_MODES]}, "
                         f"got {oct(mode)}")
    try:
        shm = SharedMemory(name=name, create=True, size=size)
    except OSError as exc:
        raise TierUnavailable(
            f"cannot create shared-memory segment {name!r} of {size} bytes: {exc}; "
            "check /dev/shm size (docker: --shm-size) and free memory"
        ) from exc
    fd: int = shm._fd  # type: ignore[attr-defined]
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a reaper probing it holds it for microseconds
        if gid is not None:
            os.fchown(fd, -1, gid)
        if mode != 0o600:
            os.fchmod(fd, mode)
    except OSError as exc:
        destroy_segment(shm)
        raise TierUnavailable(
            f"cannot give shared-memory segment {name!r} mode {oct(mode)}"
            + (f" and group {gid}" if gid is not None else "") + f": {exc} (a group must be "
            "one this server's user belongs to)") from exc
    if prefault:
        try:
            pages = np.frombuffer(cast(memoryview, shm.buf), dtype=np.uint8)
            pages[::PAGE_SIZE] = 0
            del pages
        except BaseException:
            destroy_segment(shm)
            raise
    _OWNED.add(shm.name)
    return shm


def segment_is_live(path: str) -> bool | None:
    """Whether the segment file at ``path`` still has its owner (it holds the flock).

    None when that cannot be told (the file is gone, or not ours to open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # drops the lock taken, if any
    return False


def attach_segment(name: str) -> SharedMemory:
    """Map an existing segment by name (client side) without taking ownership.

    The segment is unregistered from ``multiprocessing.resource_tracker`` so this
    process's exit does not unlink the owner's segment (see the module docstring).
    Call ``close()`` on the result when done; never ``unlink()``.
    """
    if sys.version_info >= (3, 13):  # pragma: no cover - 3.13 has track=False
        return SharedMemory(name=name, create=False, track=False)  # type: ignore[call-arg]
    # One attach at a time per process: the tracker keeps a set of names, so two
    # threads' register, register, unregister, unregister makes it print a KeyError.
    with _ATTACH_LOCK:
        shm = SharedMemory(name=name, create=False)
        if name not in _OWNED:
            # SharedMemory registered its private "/name" form; unregister the same string.
            # (Not when this process owns it: the owner's registration must stay.)
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def destroy_segment(shm: SharedMemory) -> None:
    """Unmap and unlink a segment the caller owns. Safe if views are still alive.

    When views of the segment are still exported (a reader holds a memoryview
    from ``get``), the mapping cannot be closed now: the name is unlinked anyway
    and the memory is unmapped by the kernel/CPython when the last view goes.
    """
    try:
        shm.close()
    except BufferError:
        log.debug("segment %s still has exported views; unmapping when they go", shm.name)
        # Drop our handles without closing the mmap: the views keep it alive and
        # CPython unmaps it when the last one is released. Clearing these stops
        # SharedMemory.__del__ from retrying close() and raising in a finalizer.
        shm._buf = None  # type: ignore[attr-defined]
        shm._mmap = None  # type: ignore[attr-defined]
        shm.close()  # closes the fd only
    with contextlib.suppress(FileNotFoundError):
        shm.unlink()
