"""The event bus: the engine's :class:`~kvstore.events.sink.EventSink`.

The engine calls ``block_stored`` / ``block_removed`` / ``all_cleared``
synchronously, from any thread; each call only appends to a queue and, the
first time after an idle spell, schedules one drain on the bus's event loop.
The drain turns everything queued into one ``KVEventBatch`` (so the events of
one engine step travel together; at most one batch per ``events.batch_ms``, what
comes sooner waits for the next), assigns the next sequence number, encodes it
once, keeps it in a bounded :class:`ReplayBuffer` and fans it out to the
publishers (ZMQ) and to in-process subscribers (the gRPC ``SubscribeEvents``
stream). All consumers see the same ``(seq, ts, payload)``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvstore.events import wire
from kvstore.events.builder import EventBuilder
from kvstore.events.config import EventsConfig
from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["EventBus", "MemoryPublisher", "PublishedBatch", "Publisher", "ReplayBuffer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PublishedBatch:
    seq: int
    ts: float
    payload: bytes


class Publisher(Protocol):
    """Something the bus hands every encoded batch to, in sequence order."""

    async def start(self) -> None: ...

    def publish(self, batch: PublishedBatch) -> None: ...

    async def close(self) -> None: ...


class MemoryPublisher:
    """Keeps every batch in a list (a real publisher, for tests and tools)."""

    def __init__(self) -> None:
        self.batches: list[PublishedBatch] = []

    async def start(self) -> None:
        return None

    def publish(self, batch: PublishedBatch) -> None:
        self.batches.append(batch)

    async def close(self) -> None:
        return None


class ReplayBuffer:
    """The last ``maxlen`` batches, for replay (sequence numbers are contiguous)."""

    def __init__(self, maxlen: int) -> None:
        self._items: deque[PublishedBatch] = deque(maxlen=maxlen)

    def append(self, batch: PublishedBatch) -> None:
        self._items.append(batch)

    def since(self, start_seq: int) -> list[PublishedBatch]:
        """Batches with ``seq >= start_seq`` still buffered, in order."""
        if not self._items:
            return []
        skip = max(0, start_seq - self._items[0].seq)
        return list(itertools.islice(self._items, skip, None))

    @property
    def first_seq(self) -> int | None:
        return self._items[0].seq if self._items else None

    def __len__(self) -> int:
        return len(self._items)


class _Subscriber:
    __slots__ = ("lagged", "limit", "queue")

    def __init__(self, limit: int) -> None:
        self.queue: asyncio.Queue[PublishedBatch | None] = asyncio.Queue()
        self.limit = limit
        self.lagged = False


_Pending = tuple[str, Any, Any]


class EventBus:
    """Batches, numbers, buffers and fans out KV events. See the module docstring."""

    def __init__(
        self,
        config: EventsConfig | None = None,
        publishers: Sequence[Publisher] = (),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config or EventsConfig()
        self.replay = ReplayBuffer(self.config.buffer_steps)
        self._publishers = list(publishers)
        self._clock = clock
        self._pending: deque[_Pending] = deque()
        self._wake_scheduled = False
        #: (monotonic) the earliest the next batch goes out (``events.batch_ms``)
        self._next_batch = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._subs: set[_Subscriber] = set()
        self._closed = False
        self.next_seq = 0
        self.events_published = 0
        self.blocks_published = 0
        self.publish_failures = 0
        self.lagged_batches = 0

    @property
    def published(self) -> int:
        """Events published so far (``events_published``; the Stats RPC reads this)."""
        return self.events_published

    @property
    def dropped(self) -> int:
        """Batches lost on the way out: publishers' drops (a ZMQ high-water mark),
        publisher failures, and batches skipped for lagging subscribers."""
        return (self.publish_failures + self.lagged_batches
                + sum(int(getattr(p, "dropped", 0)) for p in self._publishers))

    @property
    def publishers(self) -> tuple[Publisher, ...]:
        return tuple(self._publishers)

    def add_publisher(self, publisher: Publisher) -> None:
        """Add a publisher (before :meth:`start`)."""
        if self._loop is not None:
            raise RuntimeError("add publishers before EventBus.start()")
        self._publishers.append(publisher)

    # ------------------------------------------------------------------ sink
    def block_stored(self, metas: Sequence[BlockMeta], medium: Medium) -> None:
        if metas:
            self._enqueue(("stored", tuple(metas), medium))

    def block_removed(self, keys: Sequence[BlockKey], medium: Medium) -> None:
        if keys:
            self._enqueue(("removed", tuple(keys), medium))

    def all_cleared(self) -> None:
        self._enqueue(("cleared", None, None))

    def publish_events(self, events: Sequence[wire.KVCacheEvent]) -> None:
        """Re-publish wire events from elsewhere (the worker's own vLLM events)."""
        if events:
            self._enqueue(("raw", tuple(events), None))

    def _enqueue(self, item: _Pending) -> None:
        if self._closed:
            return
        self._pending.append(item)
        if self._wake_scheduled or self._loop is None:
            return
        self._wake_scheduled = True
        if threading.get_ident() == self._loop_thread:
            self._loop.call_soon(self._drain)
        else:
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # loop closed during shutdown
                self._wake_scheduled = False

    # ------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        started: list[Publisher] = []
        try:
            for pub in self._publishers:
                await pub.start()
                started.append(pub)
        except BaseException:
            for pub in reversed(started):
                await pub.close()
            raise
        if self._pending:
            self._wake_scheduled = True
            self._loop.call_soon(self._drain)

    async def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        for sub in self._subs:
            sub.queue.put_nowait(None)
        for pub in reversed(self._publishers):
            try:
                await pub.close()
            except Exception:
                log.exception("closing event publisher %r failed", pub)
        self._loop = None

    # ----------------------------------------------------------- publishing
    def _drain(self) -> None:
        wait = self._next_batch - time.monotonic()
        if wait > 0 and self._loop is not None:  # (the last batch went out just now)
            self._loop.call_later(wait, self._drain)
            return
        self._wake_scheduled = False
        self.flush()

    def flush(self) -> PublishedBatch | None:
        """Publish everything queued now as one batch (call on the bus's loop thread)."""
        if not self._pending:
            return None
        cfg = self.config
        builder = EventBuilder(
            cfg.encoding, cfg.hash_format, include_token_ids=cfg.include_token_ids,
            media=cfg.media,
        )
        pending = self._pending
        while pending:
            kind, items, medium = pending.popleft()
            if kind == "stored":
                builder.stored(items, medium)
            elif kind == "removed":
                builder.removed(items, medium)
            elif kind == "cleared":
                builder.cleared()
            else:
                builder.foreign(items)
        events = builder.take()
        self._next_batch = time.monotonic() + cfg.batch_ms / 1e3
        self.blocks_published += builder.blocks
        ts = self._clock()
        payload = wire.encode_batch(ts, events, self.config.data_parallel_rank)
        batch = PublishedBatch(self.next_seq, ts, payload)
        self.next_seq += 1
        self.events_published += len(events)
        self.replay.append(batch)
        for pub in self._publishers:
            try:
                pub.publish(batch)
            except Exception:
                self.publish_failures += 1
                log.exception("event publisher %r failed on seq %d", pub, batch.seq)
        for sub in self._subs:
            if sub.queue.qsize() >= sub.limit:
                sub.lagged = True
                self.lagged_batches += 1
            else:
                sub.queue.put_nowait(batch)
        return batch

    # ------------------------------------------------------------ consumers
    async def subscribe(self, start_seq: int = -1) -> AsyncIterator[PublishedBatch]:
        """Batches in sequence order: buffered ones from ``start_seq`` on, then live.

        ``start_seq=-1`` is live only. A subscriber that falls more than
        ``buffer_steps`` batches behind is resynchronised from the replay buffer;
        what already left the buffer is skipped (the consumer sees the gap in ``seq``).
        The iterator ends when the bus closes.
        """
        sub = _Subscriber(self.config.buffer_steps)
        self._subs.add(sub)
        try:
            last = self.next_seq - 1
            if start_seq >= 0:
                last = start_seq - 1
                for batch in self.replay.since(start_seq):
                    yield batch
                    last = batch.seq
            while not self._closed or not sub.queue.empty():
                if sub.lagged:
                    sub.lagged = False
                    while not sub.queue.empty():
                        sub.queue.get_nowait()
                    for batch in self.replay.since(last + 1):
                        yield batch
                        last = batch.seq
                    continue
                item = await sub.queue.get()
                if item is None:
                    return
                if item.seq > last:
                    yield item
                    last = item.seq
        finally:
            self._subs.discard(sub)
