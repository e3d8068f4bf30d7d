"""Reads kept in place: stored blocks handed out as views of the server's shared
memory that stay valid after the call returns, under one read lease, until every
view is let go.

For a reader that hands the bytes on without copying them (the LMCache plugin
gives LMCache a memory object over the slot itself, which LMCache copies into
the KV cache and frees): the copy out of the slot that :meth:`get_each` makes is
then not made at all. The lease is the only guarantee: a view kept past it may
show another block's bytes, so a holder that may keep a view longer must copy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["HeldRead"]

log = logging.getLogger("kvstore.client")


class HeldRead:
    """Blocks of one ``hold_in_place`` call, held in the server's shared memory.

    ``views[i]`` is block i's stored bytes where they lie, checked against its
    checksum when handed out; None where block i is missing, failed its check, or
    was not placed in shared memory (then i is in ``elsewhere``: read it another
    way). ``sizes[i]``: the length of ``views[i]``, 0 where it is None.
    Each view stays valid until :meth:`let_go` of it or ``expires_at``
    (``time.monotonic()``), whichever comes first; the last ``let_go`` ends the
    lease (in the background). ``let_go`` is idempotent per index."""

    def __init__(self, views: list[memoryview | None], sizes: list[int], elsewhere: list[int],
                 expires_at: float, release: Callable[[], None]) -> None:
        self.views = views
        self.sizes = sizes
        self.elsewhere = elsewhere
        self.expires_at = expires_at
        self._held = {i for i, v in enumerate(views) if v is not None}
        self._lock = threading.Lock()
        self._release: Callable[[], None] | None = release
        if not self._held:
            self._end()

    @property
    def held(self) -> int:
        """Views not let go yet."""
        with self._lock:
            return len(self._held)

    def let_go(self, i: int) -> None:
        """Done with view ``i``: it must not be read again."""
        with self._lock:
            if i not in self._held:
                return
            self._held.discard(i)
            last = not self._held
        if last:
            self._end()

    def let_go_all(self) -> None:
        with self._lock:
            self._held.clear()
        self._end()

    def _end(self) -> None:
        with self._lock:
            release, self._release = self._release, None
        if release is None:
            return
        if time.monotonic() > self.expires_at:
            log.warning("kvstore: a block held in place was let go %.1f s after its lease "
                        "ended; a holder that keeps views this long must copy instead",
                        time.monotonic() - self.expires_at)
        release()
