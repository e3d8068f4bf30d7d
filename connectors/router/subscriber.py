"""Router-side subscriber: one ordered ZMQ stream per pod feeding a :class:`PrefixIndex`.

Each :class:`PodSubscriber` reads one sidecar's (or vLLM's) publisher through
:class:`kvstore.events.zmq_subscriber.ZmqSubscriber` (ordered, gaps repaired from
the replay socket, malformed frames counted and skipped), decodes batches of
either encoding and applies them to the shared index under the pod's name.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstore.events import wire
from kvstore.events.zmq_subscriber import SubscriberStats, ZmqSubscriber

from .index import PrefixIndex

__all__ = ["FleetSubscriber", "PodSubscriber"]

#: Called after a batch was applied: ``(pod, seq, batch)``.
AppliedHook = Callable[[str, int, wire.KVEventBatch], None]


class PodSubscriber:
    def __init__(
        self,
        pod: str,
        endpoint: str,
        index: PrefixIndex,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        start_seq: int | None = None,
        on_applied: AppliedHook | None = None,
        replay_timeout: float = 2.0,
    ) -> None:
        self.pod = pod
        self.index = index
        self._on_applied = on_applied
        self._sub = ZmqSubscriber(
            endpoint,
            self._on_batch,
            replay_endpoint=replay_endpoint,
            topic=topic,
            start_seq=start_seq,
            replay_timeout=replay_timeout,
            on_reset=lambda: index.clear_pod(pod),
        )

    @property
    def stats(self) -> SubscriberStats:
        return self._sub.stats

    @property
    def next_seq(self) -> int | None:
        """The next sequence number expected from this pod."""
        return self._sub.expected

    async def wait_synced(self) -> None:
        """Until the catch-up replay asked for with ``start_seq`` is applied."""
        await self._sub.synced.wait()

    def _on_batch(self, seq: int, payload: bytes) -> None:
        batch = wire.decode_batch(payload)
        self.index.apply(self.pod, batch.events)
        if self._on_applied is not None:
            self._on_applied(self.pod, seq, batch)

    async def start(self) -> None:
        await self._sub.start()

    async def close(self) -> None:
        await self._sub.close()


class FleetSubscriber:
    """One :class:`PodSubscriber` per pod over one shared index."""

    def __init__(self, index: PrefixIndex | None = None) -> None:
        self.index = index or PrefixIndex()
        self.pods: dict[str, PodSubscriber] = {}
        self._started = False

    async def add_pod(
        self, pod: str, endpoint: str, replay_endpoint: str | None = None, **kwargs: object
    ) -> PodSubscriber:
        if pod in self.pods:
            raise ValueError(f"pod {pod!r} is already subscribed")
        sub = PodSubscriber(pod, endpoint, self.index, replay_endpoint=replay_endpoint, **kwargs)  # type: ignore[arg-type]
        self.pods[pod] = sub
        if self._started:
            await sub.start()
        return sub

    async def remove_pod(self, pod: str) -> None:
        sub = self.pods.pop(pod)
        await sub.close()
        self.index.clear_pod(pod)

    async def start(self) -> None:
        self._started = True
        for sub in self.pods.values():
            await sub.start()

    async def close(self) -> None:
        for sub in reversed(list(self.pods.values())):
            await sub.close()
        self._started = False
