"""Ingest of the worker's own vLLM KV events.

The sidecar binds a SUB socket; vLLM's ``ZmqEventPublisher`` connects to it
(vLLM connects when its endpoint has no ``*``: start vLLM with
``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://127.0.0.1:5556"}'`` and give the sidecar
``ingest_endpoint = "tcp://127.0.0.1:5556"``). Batches of either encoding are
decoded and handed, typed, to a callback, so the engine learns which blocks sit
in the engine's GPU cache; the engine re-publishes them through
:meth:`kvstore.events.bus.EventBus.publish_events`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstore.events import wire
from kvstore.events.zmq_subscriber import SubscriberStats, ZmqSubscriber

__all__ = ["EventsCallback", "VllmEventIngest"]

#: Called with the typed events of one batch, in publish order.
EventsCallback = Callable[[Sequence[wire.KVCacheEvent]], None]


class VllmEventIngest:
    def __init__(
        self,
        endpoint: str,
        callback: EventsCallback,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
    ) -> None:
        self._callback = callback
        self._sub = ZmqSubscriber(
            endpoint, self._on_batch, replay_endpoint=replay_endpoint, topic=topic, bind=True
        )
        self.batches = 0
        self.events = 0

    @property
    def endpoint(self) -> str:
        """The bound endpoint (with the real port when started on ``:*``)."""
        return self._sub.endpoint

    @property
    def stats(self) -> SubscriberStats:
        return self._sub.stats

    def _on_batch(self, seq: int, payload: bytes) -> None:
        batch = wire.decode_batch(payload)
        self.batches += 1
        self.events += len(batch.events)
        self._callback(batch.events)

    async def start(self) -> None:
        await self._sub.start()

    async def close(self) -> None:
        await self._sub.close()
