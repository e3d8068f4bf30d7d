"""Clients of the kvstore sidecar: :class:`KVStoreClient` (blocking) and
:class:`AsyncKVStoreClient` (asyncio). Both pick the shared-memory data plane
when the server is on this host and fall back to gRPC streaming otherwise."""

from kvstore.client._common import (
    BlockSpec,
    LeaseRead,
    LookupResult,
    SlotBuffer,
    Stats,
    TierStat,
)
from kvstore.client.aio import AsyncKVStoreClient
from kvstore.client.sync import KVStoreClient

__all__ = [
    "AsyncKVStoreClient",
    "BlockSpec",
    "KVStoreClient",
    "LeaseRead",
    "LookupResult",
    "SlotBuffer",
    "Stats",
    "TierStat",
]
