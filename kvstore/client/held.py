"""Reads kept in place: stored blocks handed out as views of the server's shared
memory that stay valid after the call returns, under one read lease, until every
view is let go.

For a reader that hands the bytes on without copying them (the LMCache plugin
gives LMCache a memory object over the slot itself, which LMCache copies into
the KV cache and frees): the copy out of the slot that :meth:`get_each` makes is
then not made at all.

A view is only as good as the lease over its slot: once the lease ends, the
server may give the slot to another block. So the client *renews* the lease while
any view of it is held (:class:`Renewer`: a third of the lease before it ends, it
takes a new lease on the blocks still held, checks they are in the very slots the
views show, and only then ends the old one; the blocks stay pinned throughout).
A holder may keep a view as long as it likes; the lease still ends by the
server's clock when the holder goes away (it is let go, garbage collected, or its
process dies). Only a renewal that fails (the sidecar is gone or refuses) leaves a
view uncovered: that is logged at WARNING when it happens, not when the view is
let go.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence

__all__ = ["HeldRead", "Renewal", "Renewer"]

log = logging.getLogger("kvstore.client")

#: A renewed lease: (when it ends, ``time.monotonic()``; the call that ends it).
Renewal = tuple[float, Callable[[], None]]
#: Renew a lease when this share of it is left.
RENEW_AT = 1 / 3


class HeldRead:
    """Blocks of one ``hold_in_place`` call, held in the server's shared memory.

    ``views[i]`` is block i's stored bytes where they lie, checked against its
    checksum when handed out; None where block i is missing, failed its check, or
    was not placed in shared memory (then i is in ``elsewhere``: read it another
    way). ``sizes[i]``: the length of ``views[i]``, 0 where it is None.
    Each view stays valid until :meth:`let_go` of it: the lease is renewed while
    any view is held (``renew``: takes a new lease over the given views' blocks,
    in the same slots, or answers None), and ``expires_at`` (``time.monotonic()``)
    is when the current one ends. The last ``let_go`` ends the lease (in the
    background). ``let_go`` is idempotent per index."""

    def __init__(self, views: list[memoryview | None], sizes: list[int], elsewhere: list[int],
                 expires_at: float, release: Callable[[], None],
                 renew: Callable[[Sequence[int]], Renewal | None] | None = None,
                 lease_seconds: float = 0.0) -> None:
        self.views = views
        self.sizes = sizes
        self.elsewhere = elsewhere
        self.expires_at = expires_at
        self.lease_seconds = lease_seconds
        #: Leases taken over since the first (renewals).
        self.renewals = 0
        #: False once a renewal failed: views kept past ``expires_at`` are uncovered.
        self.covered = True
        self._held = {i for i, v in enumerate(views) if v is not None}
        self._lock = threading.Lock()
        self._release: Callable[[], None] | None = release
        self._renew = renew
        if not self._held:
            self._end()

    @property
    def held(self) -> int:
        """Views not let go yet."""
        with self._lock:
            return len(self._held)

    def renew_due(self) -> float:
        """When the lease should be renewed (``time.monotonic()``)."""
        return self.expires_at - RENEW_AT * self.lease_seconds

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

    def renew(self) -> bool:
        """Renew the lease over the views still held; True if renewed (call again by
        :meth:`renew_due`), False when nothing is held or the renewal failed."""
        with self._lock:
            held = sorted(self._held)
            if not held or self._renew is None or self._release is None:
                return False
        got = self._renew(held)
        if got is None:
            return False
        expires_at, release = got
        with self._lock:
            old, self._release = self._release, release
            ended = old is None  # every view was let go meanwhile
            if not ended:
                self.expires_at = expires_at
                self.renewals += 1
        if ended:
            release()  # the new lease is not needed
            return False
        if old is not None:
            old()  # the blocks are pinned by the new lease already
        return True

    def uncovered(self) -> None:
        """A renewal failed: views kept past ``expires_at`` may show other bytes."""
        with self._lock:
            if not self._held or not self.covered:
                return
            self.covered = False
            n = len(self._held)
        log.warning("kvstore: the read lease over %d block(s) held in place could not be "
                    "renewed; it ends in %.1f s, and views kept past that may show other "
                    "blocks' bytes", n, max(0.0, self.expires_at - time.monotonic()))

    def _end(self) -> None:
        with self._lock:
            release, self._release = self._release, None
        if release is None:
            return
        if time.monotonic() > self.expires_at:
            log.warning("kvstore: a block held in place was let go %.1f s after its lease "
                        "ended (its renewal failed)", time.monotonic() - self.expires_at)
        release()


class Renewer:
    """One thread per client renewing the leases of its held reads on time. Holds them
    weakly: a held read its holder dropped is no longer renewed (its lease ends by the
    server's clock)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, weakref.ref[HeldRead]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, held: HeldRead) -> None:
        """Renew ``held`` while any of its views is held."""
        if held.lease_seconds <= 0:
            return
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._due, (held.renew_due(), next(self._seq), weakref.ref(held)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvstore-renew",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._due.clear()
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (
                        not self._due or self._due[0][0] > time.monotonic()):
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, ref = heapq.heappop(self._due)
            held = ref()
            if held is None or not held.held:
                continue
            try:
                renewed = held.renew()
            except Exception as exc:  # noqa: BLE001 (a renewal must never kill the thread)
                log.warning("kvstore: renewing a read lease failed: %s", exc)
                renewed = False
            if renewed:
                self.add(held)
            elif held.held:
                left = held.expires_at - time.monotonic()
                if left > 0.05:  # try again before the lease ends
                    with self._cond:
                        heapq.heappush(self._due, (time.monotonic() + left / 2,
                                                   next(self._seq), ref))
                else:
                    held.uncovered()
