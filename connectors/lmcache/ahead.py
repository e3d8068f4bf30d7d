"""Chunks a contains call held for the get that follows it.

LMCache retrieves in two calls to a remote backend: ``batched_contains`` (how long
is the stored prefix?) then a get of that prefix. With ``hold_ahead_s`` the plugin
answers the first with :meth:`~kvstore.client.KVStoreClient.lookup_and_hold`, one
round trip that both looks the prefix up (the policy sees it as any lookup) and
takes its read lease, and keeps the held slots here for the get: the get then
makes no round trip before it hands the slots over. A contains that no get
follows (LMCache's scheduler-side ``lookup``) costs a lease for ``ttl_s``, after
which a timer lets go of what was not taken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from kvstore.client import HeldRead

__all__ = ["HeldAhead"]


class HeldAhead:
    """(namespace, block hash) -> a held slot, for up to ``ttl_s`` seconds."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._held: dict[tuple[str, bytes], tuple[HeldRead, int, float]] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._closed = False
        #: Slots held ahead, by what came of them: taken by a get, let go unused
        #: (``ttl_s`` passed, or a later contains held the same chunk again).
        self.counts = {"taken": 0, "unused": 0}

    def keep(self, namespace: str, hashes: Sequence[bytes], held: HeldRead) -> None:
        """Keep ``held`` (one entry per hash) for a get; its views that are None
        (not held) are not kept."""
        now = time.monotonic()
        replaced: list[tuple[HeldRead, int, float]] = []
        with self._lock:
            closed = self._closed
            if not closed:
                for j, h in enumerate(hashes):
                    if held.views[j] is None:
                        continue
                    old = self._held.pop((namespace, h), None)
                    if old is not None:
                        replaced.append(old)
                    self._held[(namespace, h)] = (held, j, now)
                self.counts["unused"] += len(replaced)
                if self._timer is None and self._held:
                    self._arm(self.ttl_s)
        if closed:
            held.let_go_all()
        for gone, j, _ in replaced:
            gone.let_go(j)

    def take(self, namespace: str, hashes: Sequence[bytes]
             ) -> list[tuple[HeldRead, int] | None]:
        """The held slot of each hash, or None; taken ones are the caller's to let go."""
        out: list[tuple[HeldRead, int] | None] = []
        with self._lock:
            for h in hashes:
                got = self._held.pop((namespace, h), None)
                out.append(None if got is None else (got[0], got[1]))
            self.counts["taken"] += sum(1 for o in out if o is not None)
        return out

    def take_all(self, wanted: Sequence[tuple[str, bytes]]
                 ) -> list[tuple[HeldRead, int]] | None:
        """The held slots of every (namespace, hash) in ``wanted``, or None (and
        nothing taken) if any is not held."""
        with self._lock:
            if not wanted or any(w not in self._held for w in wanted):
                return None
            got = [self._held.pop(w) for w in wanted]
            self.counts["taken"] += len(got)
        return [(held, j) for held, j, _ in got]

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        """Let go of everything held; later keeps let go at once."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            left, self._held = list(self._held.values()), {}
            self.counts["unused"] += len(left)
        for held, j, _ in left:
            held.let_go(j)

    def _arm(self, delay: float) -> None:  # under the lock
        self._timer = threading.Timer(max(delay, 0.001), self._sweep)
        self._timer.daemon = True
        self._timer.start()

    def _sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._timer = None
            stale = [k for k, (_, _, t) in self._held.items() if now - t >= self.ttl_s]
            left = [self._held.pop(k) for k in stale]
            self.counts["unused"] += len(left)
            if self._held and not self._closed:
                oldest = min(t for _, _, t in self._held.values())
                self._arm(oldest + self.ttl_s - now)
        for held, j, _ in left:
            held.let_go(j)
