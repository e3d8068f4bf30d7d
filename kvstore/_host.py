"""Host identity: the same for every process on one host (so a client can tell
whether the server's shared memory is reachable)."""

from __future__ import annotations

import functools
import socket


@functools.cache
def host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()
