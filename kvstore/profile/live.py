"""The live profile: the same statistics over a sliding window of the traffic a
server sees, in bounded memory.

The gRPC servicer feeds one :class:`LiveProfile` from Lookup (a request
arrives: its blocks, session and workload), Put / Commit (stored blocks: tokens
per block and KV bytes per token) and Hint (what follows a session's last
request, and its output length when the hint carries it). :meth:`snapshot`
runs the offline section functions over the window.

Bounds: the last ``max_requests`` requests within ``window_s`` seconds (a ring),
and for prefix reuse at most ``max_blocks`` recently seen blocks
(:class:`RecentBlocks`). Each request's reuse is measured when it arrives,
against the blocks seen before it; until a generation of blocks closes, that is
exactly the unbounded cache of the offline profile.

What the sidecar cannot see: input length is counted in whole hashed blocks
(vLLM hashes full blocks only), output length only from hints that carry it,
and no latency target. Requests without a session id are in every section but
the sessions one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from kvstore.profile.model import Profile, Row
from kvstore.profile.sections import profile_rows

__all__ = ["HINT_AFTER", "LiveProfile", "RecentBlocks"]

#: Hint events that say what follows a session's last request (as trace ``after``).
HINT_AFTER = {"tool_call": "tool_call", "turn_end": "user", "session_end": "end"}

_NOTES = (
    "latency target: not visible to the sidecar",
    "input length: whole hashed blocks (vLLM hashes full blocks only)",
)


class _Call:
    __slots__ = ("after", "blocks", "hits", "output", "session", "t", "tool", "workload")

    def __init__(self, t: float, blocks: int, hits: int, session: str | None,
                 workload: str | None) -> None:
        self.t = t
        self.blocks = blocks
        self.hits = hits
        self.session = session
        self.workload = workload
        self.after: str | None = None
        self.tool: str | None = None
        self.output: int | None = None


class RecentBlocks:
    """Blocks seen lately, per namespace, in two generations: a block counts as
    seen while it is in either. The current generation closes when it holds
    ``max_blocks / 2`` blocks or is half a window old; the one before it is then
    forgotten. So a block is remembered for half a window to a window (less when
    ``max_blocks / 2`` newer blocks arrive first), in at most ~``max_blocks``
    entries, at the cost of one set insert per block."""

    __slots__ = ("_cur", "_cur_size", "_gen_cap", "_prev", "_start", "window_s")

    def __init__(self, window_s: float, max_blocks: int) -> None:
        self.window_s = window_s
        self._gen_cap = max(1, max_blocks // 2)
        self._cur: dict[str, set[bytes]] = {}
        self._prev: dict[str, set[bytes]] = {}
        self._cur_size = 0
        self._start: float | None = None

    def __len__(self) -> int:
        return self._cur_size + sum(len(s) for s in self._prev.values())

    def _roll(self, now: float) -> None:
        if self._start is None:
            self._start = now
        age = now - self._start
        if age >= self.window_s:  # both generations are older than the window
            self._prev = {}
        elif age >= self.window_s / 2 or self._cur_size >= self._gen_cap:
            self._prev = self._cur
        else:
            return
        self._cur, self._cur_size, self._start = {}, 0, now

    def lookup(self, namespace: str, hashes: Sequence[bytes], now: float) -> int:
        """The leading blocks of ``hashes`` seen before; then remembers them all."""
        self._roll(now)
        cur = self._cur.setdefault(namespace, set())
        prev = self._prev.get(namespace, set())
        if all(map(cur.__contains__, hashes)):
            return len(hashes)  # a prefix seen whole (one pass in C): nothing new to keep
        hits = 0
        for h in hashes:
            if h not in cur and h not in prev:
                break
            hits += 1
        before = len(cur)
        cur.update(hashes)
        self._cur_size += len(cur) - before
        if self._cur_size >= self._gen_cap:
            self._roll(now)
        return hits

    def expire(self, now: float) -> None:
        if self._start is not None and now - self._start >= self.window_s / 2:
            self._roll(now)


class LiveProfile:
    """Thread-safe: the servicer's event loop writes, metric scrapes read."""

    def __init__(self, window_s: float = 3600.0, max_requests: int = 20_000,
                 max_blocks: int = 262_144, clock: Callable[[], float] = time.time) -> None:
        if window_s <= 0 or max_requests < 1 or max_blocks < 1:
            raise ValueError("window_s, max_requests and max_blocks must be positive")
        self._window_s = window_s
        self.clock = clock
        self._calls: deque[_Call] = deque(maxlen=max_requests)
        self._last: dict[str, _Call] = {}
        self._blocks = RecentBlocks(window_s, max_blocks)
        self._block_tokens = 0
        self._stored_bytes = 0
        self._stored_tokens = 0
        self._lock = threading.Lock()

    @property
    def window_s(self) -> float:
        return self._window_s

    @window_s.setter
    def window_s(self, value: float) -> None:
        if value <= 0:
            raise ValueError(f"window_s must be > 0, got {value}")
        self._window_s = self._blocks.window_s = value

    # -- feeding (one call per RPC) ---------------------------------------------------
    def on_lookup(self, namespace: str, hashes: Sequence[bytes], session_id: str = "",
                  workload: str = "") -> None:
        now = self.clock()
        hashes = list(hashes)  # (a protobuf field makes new bytes on every pass)
        with self._lock:
            self._expire(now)
            hits = self._blocks.lookup(namespace, hashes, now)
            calls = self._calls
            if len(calls) == calls.maxlen:
                self._forget(calls[0])
            call = _Call(now, len(hashes), hits, session_id or None, workload or None)
            calls.append(call)
            if call.session is not None:
                self._last[call.session] = call

    def on_store(self, blocks: Iterable[tuple[int, int]]) -> None:
        """``blocks``: (payload bytes, tokens) of each block stored (Put / Commit)."""
        with self._lock:
            for size, ntok in blocks:
                if ntok > 0:
                    self._block_tokens = max(self._block_tokens, ntok)
                    self._stored_bytes += size
                    self._stored_tokens += ntok

    def on_hint(self, session_id: str, event: str, tool: str = "",
                output_tokens: int = 0) -> None:
        after = HINT_AFTER.get(event)
        with self._lock:
            call = self._last.get(session_id)
            if call is None:
                return
            if after is not None:
                call.after = after
                call.tool = tool or None
            if output_tokens > 0:
                call.output = output_tokens

    # -- reading ------------------------------------------------------------------------
    def _forget(self, call: _Call) -> None:
        if call.session is not None and self._last.get(call.session) is call:
            del self._last[call.session]

    def _expire(self, now: float) -> None:
        start = now - self.window_s
        calls = self._calls
        while calls and calls[0].t < start:
            self._forget(calls.popleft())
        self._blocks.expire(now)

    def rows(self) -> tuple[list[Row], int]:
        """The window's requests as profile rows, and the tokens per block."""
        with self._lock:
            self._expire(self.clock())
            calls = list(self._calls)
            bt = self._block_tokens
        return [Row(c.t, c.blocks * bt, c.output, c.blocks, c.hits, c.session, c.workload,
                    c.after, c.tool) for c in calls], bt

    @property
    def kv_bytes_per_token(self) -> float | None:
        with self._lock:
            if not self._stored_tokens:
                return None
            return self._stored_bytes / self._stored_tokens

    def snapshot(self, source: str = "live") -> Profile:
        rows, bt = self.rows()
        notes = list(_NOTES)
        if any(r.output_tokens is None for r in rows):
            notes.append("output length: only for requests whose hint carried output_tokens")
        if not bt:
            notes.append("tokens per block: unknown until a block is stored (input counted as 0)")
        return profile_rows(rows, source=source, fmt="live", block_tokens=bt, notes=notes,
                            window_s=self.window_s, kv_bytes_per_token=self.kv_bytes_per_token)
