"""kvstore: KV-cache tiering and prefix store sidecar for LLM serving."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvstore.errors import KVStoreError
from kvstore.types import BlockData, BlockKey, BlockMeta, Medium, Workload

__version__ = "0.1.0"

__all__ = [
    "AsyncKVStoreClient",
    "BlockData",
    "BlockKey",
    "BlockMeta",
    "KVStoreClient",
    "KVStoreError",
    "Medium",
    "Workload",
    "__version__",
]

if TYPE_CHECKING:
    from kvstore.client import AsyncKVStoreClient, KVStoreClient


def __getattr__(name: str) -> Any:
    # The clients pull in grpc: import them only when asked for.
    if name in ("KVStoreClient", "AsyncKVStoreClient"):
        from kvstore import client

        return getattr(client, name)
    raise AttributeError(f"module 'kvstore' has no attribute {name!r}")
