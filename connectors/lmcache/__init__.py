"""The LMCache remote-storage plugin of kvstore (LMCache 0.5.x).

LMCache configuration (YAML)::

    remote_storage_plugins: ["kvstore"]
    extra_config:
      remote_storage_plugin.kvstore.module_path: kvstore.connectors.lmcache
      remote_storage_plugin.kvstore.class_name: KVStoreConnectorAdapter
      remote_storage_plugin.kvstore.address: "127.0.0.1:50051"

The LMCache-facing classes import LMCache (and torch); they load only when asked
for, so the pure parts (settings, key mapping, the fail-open link) import without
it. Modules: :mod:`.config` (settings), :mod:`.keys` (CacheEngineKey -> namespace
and block hash), :mod:`.link` (fail-open sidecar calls), :mod:`.ahead` (slots a
contains held for the get after it), :mod:`.connector` (the ``RemoteConnector``;
its get side in :mod:`.reads`), :mod:`.adapter` (how LMCache finds it),
:mod:`.cpu_kv` (LMCache's engine on CPU tensors, for standalone runs). The
measurements are tools: :mod:`kvstore.tools.lmcache`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvstore.connectors.lmcache.config import PLUGIN_TYPE, PluginConfig
from kvstore.connectors.lmcache.keys import ChunkLayout, KeyMapper, block_hash_of

__all__ = [
    "PLUGIN_TYPE",
    "ChunkLayout",
    "KVStoreConnectorAdapter",
    "KVStoreRemoteConnector",
    "KeyMapper",
    "PluginConfig",
    "block_hash_of",
]

if TYPE_CHECKING:
    from kvstore.connectors.lmcache.adapter import KVStoreConnectorAdapter
    from kvstore.connectors.lmcache.connector import KVStoreRemoteConnector


def __getattr__(name: str) -> Any:
    if name == "KVStoreConnectorAdapter":
        from kvstore.connectors.lmcache.adapter import KVStoreConnectorAdapter

        return KVStoreConnectorAdapter
    if name == "KVStoreRemoteConnector":
        from kvstore.connectors.lmcache.connector import KVStoreRemoteConnector

        return KVStoreRemoteConnector
    raise AttributeError(f"module 'kvstore.connectors.lmcache' has no attribute {name!r}")
