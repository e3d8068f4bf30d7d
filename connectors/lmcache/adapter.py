"""``KVStoreConnectorAdapter``: how LMCache finds and builds the plugin.

LMCache 0.5.x loads a remote-storage plugin from its config: for every name in
``remote_storage_plugins`` it imports ``extra_config["remote_storage_plugin.<name>.module_path"]``,
takes the class ``...class_name`` from it, instantiates it (an adapter, no arguments)
and asks each adapter ``can_parse("plugin://<name>")``; the one that says yes builds the
connector from a ``ConnectorContext`` (loop, LMCache's CPU allocator, config, metadata,
plugin name). This adapter answers for the plugin type ``kvstore``: the names
``kvstore`` and ``kvstore.<instance>`` (several sidecars, each its own instance name
and settings).

A configuration the plugin cannot serve (a compressing ``remote_serde``, layer-wise
chunks) raises a :class:`~kvstore.errors.ConfigError` here, once, at start: LMCache
logs it and runs without this backend. Nothing fails later at request time.
"""

from __future__ import annotations

from typing import Any

from kvstore.connectors.lmcache.config import PLUGIN_TYPE, PluginConfig
from kvstore.connectors.lmcache.connector import KVStoreRemoteConnector
from lmcache.v1.storage_backend.connector import ConnectorAdapter

from kvstore.errors import ConfigError

__all__ = ["KVStoreConnectorAdapter"]

_SCHEME = "plugin://"


class KVStoreConnectorAdapter(ConnectorAdapter):
    def __init__(self) -> None:
        super().__init__(f"{_SCHEME}{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return url.startswith(_SCHEME) and url[len(_SCHEME):].split(".", 1)[0] == PLUGIN_TYPE

    def create_connector(self, context: Any) -> KVStoreRemoteConnector:
        config = context.config
        if config is None or context.metadata is None:
            raise ConfigError("the kvstore plugin needs LMCache's engine config and metadata")
        name = context.plugin_name or context.url[len(_SCHEME):] or PLUGIN_TYPE
        settings = PluginConfig.from_extra_config(config.extra_config, name)
        serde = getattr(config, "remote_serde", "naive") or "naive"
        if serde != "naive":
            raise ConfigError(f"remote_serde {serde!r} is not supported by the kvstore plugin: "
                              "it stores chunks as they are; use remote_serde: naive")
        if getattr(config, "use_layerwise", False):
            raise ConfigError("use_layerwise is not supported by the kvstore plugin: "
                              "it stores whole chunks; set use_layerwise: false")
        return KVStoreRemoteConnector(settings, config, context.metadata,
                                      context.local_cpu_backend)
