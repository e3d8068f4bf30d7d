"""What vLLM publishes about its own prefix cache, for the replay's engine cache model.

In a deployment vLLM publishes ``BlockStored`` / ``BlockRemoved`` events of its GPU
KV cache (medium ``GPU``, int64 block hashes, no locality) and the sidecar, which
ingests them, re-publishes them with its own tiers' events on its bus
(``kvstore/server/app.py``: :class:`~kvstore.events.VllmCacheMirror` then
:meth:`~kvstore.events.EventBus.publish_events`), so a router subscribed to the pod
sees one stream covering the engine and the sidecar. :class:`VllmCacheEvents` is
the engine side of that for :class:`~kvstore.replay.engine_cache.EngineCache`: it
hears the cache (a :class:`~kvstore.replay.engine_cache.CacheListener`) and hands the
wire events vLLM would send to ``publish``. A trace has no token ids, so
``token_ids`` is empty and ``block_size`` the cost model's tokens per block; a
block's hash is its trace id (as the sidecar's events carry it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstore.events import KVCacheEvent, wire
from kvstore.types import Medium

__all__ = ["VLLM_GPU_MEDIUM", "VllmCacheEvents"]

#: The medium vLLM names its own KV cache by.
VLLM_GPU_MEDIUM = Medium.GPU.value

#: Takes the events of one cache change, in order.
PublishEvents = Callable[[Sequence[KVCacheEvent]], None]


class VllmCacheEvents:
    """An engine cache's listener that publishes vLLM's GPU events."""

    __slots__ = ("block_size", "blocks_removed", "blocks_stored", "publish")

    def __init__(self, publish: PublishEvents, block_size: int) -> None:
        self.publish = publish
        self.block_size = block_size
        self.blocks_stored = 0
        self.blocks_removed = 0

    def stored(self, blocks: Sequence[int], parent: int | None) -> None:
        self.blocks_stored += len(blocks)
        self.publish([wire.stored(list(blocks), parent, [], self.block_size, VLLM_GPU_MEDIUM)])

    def removed(self, blocks: Sequence[int]) -> None:
        self.blocks_removed += len(blocks)
        self.publish([wire.removed(list(blocks), VLLM_GPU_MEDIUM)])
