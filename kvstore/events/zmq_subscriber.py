"""Ordered reader of one publisher's ZMQ stream (the transport stage).

Knows topics, sequence numbers and payload bytes, nothing of the domain: it
hands ``(seq, payload)`` to a callback in sequence order, exactly once each.

* a sequence gap (ZMQ dropped messages past the high-water mark, or the
  subscriber joined late) is filled from the publisher's replay socket before
  the newer batch is delivered; what the replay buffer no longer holds is
  counted in ``stats.missed`` and skipped;
* a malformed frame (wrong part count, a sequence that is not 8 bytes) or a
  payload the callback rejects with :class:`~kvstore.events.wire.MalformedBatch`
  is counted in ``stats.malformed`` and skipped; the stream goes on;
* ``start_seq`` (late joiner) asks for replay from that sequence before going live;
* a publisher restart (the live sequence goes backwards: vLLM and our bus start
  at 0) calls ``on_reset`` (the router forgets the pod) and resynchronises from 0.

A batch lost at the very end of a quiet stream is only noticed when the next one
arrives (as in vLLM's own subscriber).

``bind=True`` binds the SUB socket (the sidecar's ingest: vLLM's publisher connects).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from kvstore.events.wire import MalformedBatch

__all__ = ["SubscriberStats", "ZmqSubscriber"]

log = logging.getLogger(__name__)

BatchHandler = Callable[[int, bytes], None]


@dataclass(slots=True)
class SubscriberStats:
    received: int = 0
    delivered: int = 0
    duplicates: int = 0
    gaps: int = 0
    replayed: int = 0
    missed: int = 0
    malformed: int = 0
    handler_errors: int = 0
    restarts: int = 0


class ZmqSubscriber:
    def __init__(
        self,
        endpoint: str,
        on_batch: BatchHandler,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        bind: bool = False,
        start_seq: int | None = None,
        replay_timeout: float = 2.0,
        on_reset: Callable[[], None] | None = None,
        curve: tuple[str, str] | None = None,
    ) -> None:
        """``curve``: (the publisher's public key file, this client's secret key file)
        for a publisher with CURVE on (:mod:`kvstore.events.curve`)."""
        self.endpoint = endpoint
        self._curve = curve
        self.replay_endpoint = replay_endpoint or None
        self._on_batch = on_batch
        self._topic = topic.encode()
        self._bind = bind
        self._start_seq = start_seq
        self._replay_timeout = replay_timeout
        self._on_reset = on_reset
        self._last_live: int | None = None
        self._ctx = zmq.asyncio.Context.instance()
        self._sub: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.expected: int | None = None
        self.stats = SubscriberStats()
        self.synced = asyncio.Event()

    async def start(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._secure(sub)
        if self._bind:
            sub.bind(self.endpoint)
            self.endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            sub.connect(self.endpoint)
        self._sub = sub
        self._task = asyncio.create_task(self._run(), name=f"kv-events-sub {self.endpoint}")

    def _secure(self, sock: zmq.asyncio.Socket) -> None:
        if self._curve is not None:
            from kvstore.events.curve import curve_client

            curve_client(sock, *self._curve)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for sock in (self._dealer, self._sub):
            if sock is not None:
                sock.close(0)
        self._dealer = self._sub = None

    async def _run(self) -> None:
        sub = self._sub
        if sub is None:
            return
        if self._start_seq is not None:
            self.expected = self._start_seq
            await self._replay(self._start_seq, until=None)
        self.synced.set()
        while True:
            frames = await sub.recv_multipart(copy=True)
            await self._on_frames(frames)

    async def _on_frames(self, frames: list[bytes]) -> None:
        self.stats.received += 1
        if len(frames) != 3 or len(frames[1]) != 8:
            self.stats.malformed += 1
            log.warning("skipping malformed KV event frame (%d parts)", len(frames))
            return
        seq = int.from_bytes(frames[1], "big")
        if self._last_live is not None and seq < self._last_live:
            self._restarted()
        self._last_live = seq
        if self.expected is None:
            self.expected = seq
        if seq < self.expected:
            self.stats.duplicates += 1
            return
        if seq > self.expected:
            self.stats.gaps += 1
            await self._replay(self.expected, until=seq)
            if seq < self.expected:  # the replay already delivered it
                return
            if seq > self.expected:
                self.stats.missed += seq - self.expected
                self.expected = seq
        self._deliver(seq, frames[2])

    def _restarted(self) -> None:
        """The live stream went backwards: a new publisher process numbering from 0."""
        self.stats.restarts += 1
        log.warning("KV event publisher at %s restarted; resynchronising", self.endpoint)
        self.expected = 0
        if self._on_reset is not None:
            self._on_reset()

    def _deliver(self, seq: int, payload: bytes) -> None:
        self.expected = seq + 1
        try:
            self._on_batch(seq, payload)
        except MalformedBatch as exc:
            self.stats.malformed += 1
            log.warning("skipping malformed KV event batch seq %d: %s", seq, exc)
            return
        except Exception:
            self.stats.handler_errors += 1
            log.exception("KV event handler failed on seq %d", seq)
            return
        self.stats.delivered += 1

    async def _replay(self, start: int, until: int | None) -> None:
        """Ask the replay socket for batches from ``start`` and deliver them in order."""
        if self.replay_endpoint is None:
            return
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._secure(self._dealer)
            self._dealer.connect(self.replay_endpoint)
        dealer = self._dealer
        await dealer.send_multipart((b"", start.to_bytes(8, "big")))
        while True:
            if not await dealer.poll(int(self._replay_timeout * 1000)):
                log.warning("replay from %s timed out; continuing live", self.replay_endpoint)
                dealer.close(0)  # late answers must not mix with the next request
                self._dealer = None
                return
            frames = await dealer.recv_multipart()
            if len(frames) != 4 or len(frames[2]) != 8:
                self.stats.malformed += 1
                continue
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq < 0:
                return
            expected = self.expected if self.expected is not None else seq
            if seq < expected or (until is not None and seq >= until + 1):
                continue
            if seq > expected:
                self.stats.missed += seq - expected
            self.stats.replayed += 1
            self._deliver(seq, frames[3])
