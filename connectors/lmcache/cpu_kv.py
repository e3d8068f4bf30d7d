"""LMCache's engine on CPU tensors, without vLLM or a GPU (for tests and benchmarks).

:class:`CPUKVConnector` is an LMCache ``GPUConnectorInterface`` whose "device" KV
cache is one CPU tensor per request in LMCache's own chunk layout, KV_2LTD
``[2, layers, tokens, hidden]``: storing a chunk copies tokens ``start:end`` into
the chunk's memory object, retrieving copies them back (``kvcaches=`` the tensor).
:func:`make_engine` builds a real ``LMCacheEngine`` around it; :class:`PutTracker`
tells when the puts it fired at remote backends have ended. Imports LMCache.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

__all__ = ["CPUKVConnector", "PutTracker", "destroy_engine", "make_engine"]

_ids = itertools.count()


class CPUKVConnector(GPUConnectorInterface):
    def __init__(self, num_layers: int, hidden: int) -> None:
        self.num_layers = num_layers
        self.hidden = hidden

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.num_layers, num_tokens, self.hidden])

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        memory_obj.tensor.copy_(kwargs["kvcaches"][:, :, start:end, :])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        kwargs["kvcaches"][:, :, start:end, :].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs: Sequence[Any], starts: Sequence[int],
                         ends: Sequence[int], **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs: Sequence[Any] | None = None,
                       starts: Sequence[int] | None = None, ends: Sequence[int] | None = None,
                       **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs or (), starts or (), ends or (), strict=True):
            self.to_gpu(obj, start, end, **kwargs)


def make_engine(config: Mapping[str, Any], *, model: str = "kvstore-test/tiny",
                num_layers: int = 4, num_kv_heads: int = 2, head_size: int = 64,
                dtype: torch.dtype = torch.bfloat16, world_size: int = 1,
                worker_id: int = 0) -> tuple[Any, CPUKVConnector]:
    """A real ``LMCacheEngine`` (post-initialised, its own instance id) on CPU tensors.

    ``config`` is LMCache's configuration as a dict (what its YAML file holds)."""
    from lmcache.utils import mock_up_broadcast_fn, mock_up_broadcast_object_fn
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata

    cfg = LMCacheEngineConfig.from_dict(dict(config))
    chunk = cfg.chunk_size
    metadata = LMCacheMetadata(
        model_name=model, world_size=world_size, local_world_size=world_size,
        worker_id=worker_id, local_worker_id=worker_id, kv_dtype=dtype,
        kv_shape=(num_layers, 2, chunk, num_kv_heads, head_size), chunk_size=chunk,
        role="worker")
    kv = CPUKVConnector(num_layers, num_kv_heads * head_size)
    instance = f"kvstore-cpu-{next(_ids)}"
    engine = LMCacheEngineBuilder.get_or_create(
        instance, cfg, metadata, kv, mock_up_broadcast_fn, mock_up_broadcast_object_fn)
    engine.post_init()
    engine.kvstore_instance_id = instance
    return engine, kv


def destroy_engine(engine: Any) -> None:
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    LMCacheEngineBuilder.destroy(engine.kvstore_instance_id)


class PutTracker:
    """When have the puts LMCache fired at its remote backends finished?

    LMCache's ``store`` hands chunks to remote backends and returns without waiting.
    This wraps each remote backend's connection (any connector: the plugin's, Redis's)
    and records when each key's put ended, so a test or a benchmark can wait for them
    and time them. The connector itself is untouched."""

    def __init__(self, engine: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._inflight = 0
        self.done_at: dict[Any, float] = {}
        self.tracked = 0
        for backend in engine.storage_manager.storage_backends.values():
            if getattr(backend, "connection", None) is not None and hasattr(backend, "put_tasks"):
                backend.connection = _TrackedConnection(backend.connection, self)
                self.tracked += 1

    def _started(self) -> None:
        with self._cond:
            self._inflight += 1

    def _ended(self, keys: Sequence[Any]) -> None:
        now = self._clock()
        with self._cond:
            for key in keys:
                self.done_at[key] = now
            self._inflight -= 1
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait until no put is in flight; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._inflight == 0, timeout)

    def wait_keys(self, keys: Sequence[Any], timeout: float) -> float | None:
        """Wait until every key's put ended; when the last one did (None on timeout)."""
        with self._cond:
            if not self._cond.wait_for(lambda: all(k in self.done_at for k in keys), timeout):
                return None
            return max(self.done_at[k] for k in keys)


class _TrackedConnection:
    def __init__(self, inner: Any, tracker: PutTracker) -> None:
        self._inner = inner
        self._tracker = tracker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def batched_put(self, keys: Sequence[Any], memory_objs: Sequence[Any]) -> Any:
        self._tracker._started()  # counted when LMCache submits, before the loop runs it

        async def run() -> Any:
            try:
                return await self._inner.batched_put(keys, memory_objs)
            finally:
                self._tracker._ended(keys)

        return run()

    def put(self, key: Any, memory_obj: Any) -> Any:
        self._tracker._started()

        async def run() -> Any:
            try:
                return await self._inner.put(key, memory_obj)
            finally:
                self._tracker._ended([key])

        return run()
