"""ZMQ publisher, byte-compatible with vLLM's ``ZmqEventPublisher``.

* PUB socket: multipart ``(topic, seq as 8-byte big-endian, msgpack KVEventBatch)``;
  bound or connected as ``events.endpoint_mode`` says (``auto``: bound when the
  endpoint has ``*``, ``::``, ``ipc://`` or ``inproc://``, connected otherwise;
  ``tcp://127.0.0.1:*`` binds loopback on a free port).
* ROUTER replay socket (always bound): a client sends the start sequence as
  8 bytes big-endian (REQ envelope ``["", start]``); it gets every buffered batch
  with ``seq >= start`` as ``(id, "", topic, seq, payload)`` and then the end
  marker ``(id, "", "", seq -1, "")``.

With ``events.curve_secret_key_file`` both sockets are CURVE servers on a context
of their own, whose authenticator admits only the configured clients
(:mod:`kvstore.events.curve`).

The PUB socket is used only from the event loop thread the bus runs on; a slow
subscriber past the high-water mark loses messages (ZMQ drops), which it
detects as a sequence gap and repairs through replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from kvstore.errors import ConfigError
from kvstore.events.bus import PublishedBatch, ReplayBuffer
from kvstore.events.config import EventsConfig

if TYPE_CHECKING:
    from kvstore.events.curve import CurveServer

__all__ = ["END_SEQ", "ZmqPublisher"]

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ZmqPublisher:
    def __init__(self, config: EventsConfig, replay: ReplayBuffer) -> None:
        self.config = config
        self._replay = replay
        self._topic = config.effective_topic.encode()
        self._curve: CurveServer | None = None
        self._own_ctx = False
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._actx = zmq.asyncio.Context.instance()
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.endpoint = config.endpoint
        self.replay_endpoint = config.replay_endpoint
        self.dropped = 0
        self.replays_served = 0

    async def start(self) -> None:
        if self.config.curve_secret_key_file:
            from kvstore.events.curve import CurveServer

            curve = CurveServer(self.config.curve_secret_key_file,
                                self.config.curve_client_keys_dir)
            # A context of our own (the ZAP handler answers for every socket of a context),
            # shared by the PUB socket and the asyncio ROUTER.
            self._ctx = zmq.Context()
            self._actx = zmq.asyncio.Context(shadow=self._ctx.underlying)
            self._own_ctx = True
            curve.start(self._ctx)
            self._curve = curve
        pub = self._ctx.socket(zmq.PUB)
        if self._curve is not None:
            self._curve.apply(pub)
        pub.set_hwm(self.config.hwm)
        pub.setsockopt(zmq.LINGER, 1000)
        try:
            if self.config.binds:
                pub.bind(self.endpoint)
                self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                pub.connect(self.endpoint)
        except zmq.ZMQError as exc:
            pub.close(0)
            self._release()
            raise ConfigError(f"events.endpoint {self.endpoint!r}: {exc}") from exc
        self._pub = pub
        if self.replay_endpoint:
            router = self._actx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.SNDHWM, 0)
            if self._curve is not None:
                self._curve.apply(router)
            try:
                router.bind(self.replay_endpoint)
            except zmq.ZMQError as exc:
                router.close(0)
                pub.close(0)
                self._pub = None
                self._release()
                raise ConfigError(
                    f"events.replay_endpoint {self.replay_endpoint!r}: {exc}"
                ) from exc
            self.replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._router = router
            self._task = asyncio.create_task(self._serve_replay(), name="kv-events-replay")

    def publish(self, batch: PublishedBatch) -> None:
        if self._pub is None:
            return
        try:
            self._pub.send_multipart(
                (self._topic, batch.seq.to_bytes(8, "big"), batch.payload), flags=zmq.NOBLOCK
            )
        except zmq.Again:
            self.dropped += 1

    async def _serve_replay(self) -> None:
        router = self._router
        if router is None:
            return
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("invalid replay request with %d frames", len(frames))
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big", signed=True)
            for batch in self._replay.since(max(start_seq, 0)):
                await router.send_multipart(
                    (client, b"", self._topic, batch.seq.to_bytes(8, "big"), batch.payload)
                )
            await router.send_multipart((client, b"", b"", END_SEQ, b""))
            self.replays_served += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._router is not None:
            self._router.close(0)
            self._router = None
        if self._pub is not None:
            self._pub.close()  # LINGER 1 s: batches already queued still go out
            self._pub = None
        self._release()

    def _release(self) -> None:
        """Stop the authenticator and end the context of our own (CURVE only)."""
        if self._curve is not None:
            self._curve.stop()
            self._curve = None
        if self._own_ctx:
            self._ctx.term()  # waits for the PUB socket's linger
            self._own_ctx = False
