"""Clients of the kvstore sidecar: :class:`KVStoreClient` (blocking) and
:class:`AsyncKVStoreClient` (asyncio). Both pick the shared-memory data plane
when the server is on this host and fall back to gRPC streaming otherwise (one
on the server's host that cannot map its segments says why at WARNING and counts
it: :mod:`kvstore.client.probe`).
Credentials (bearer token, TLS): :class:`ClientSecurity`, by default from the
environment (``KVSTORE_TOKEN``, ``KVSTORE_TLS_CA``, ...)."""

from kvstore.client._common import (
    BlockSpec,
    LeaseRead,
    LookupResult,
    QuotaStat,
    Stats,
    TierStat,
)
from kvstore.client.aio import AsyncKVStoreClient
from kvstore.client.held import HeldRead
from kvstore.client.segments import SlotBuffer
from kvstore.client.sync import KVStoreClient
from kvstore.security.client import ClientSecurity

__all__ = [
    "AsyncKVStoreClient",
    "BlockSpec",
    "ClientSecurity",
    "HeldRead",
    "KVStoreClient",
    "LeaseRead",
    "LookupResult",
    "QuotaStat",
    "SlotBuffer",
    "Stats",
    "TierStat",
]
