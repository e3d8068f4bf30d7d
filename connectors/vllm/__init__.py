"""The vLLM KV connector of kvstore.

``kv_connector_module_path="kvstore.connectors.vllm"``, ``kv_connector="KVStoreConnector"``.
The connector class imports vLLM; it is loaded only when asked for, so the
pure parts (config, sessions, payload, sidecar link) import without vLLM.

Modules: :mod:`.config` (settings, namespace), :mod:`.sidecar` (fail-open
link), :mod:`.sessions` (session inference, hints), :mod:`.payload` (checked
block bytes, in place), :mod:`.layout` (block addressing in any KV layout),
:mod:`.rows` (strided host copies), :mod:`.hostkv` / :mod:`.devicekv` (moving
blocks between KV tensors in host or device memory and slots), :mod:`.loads`,
:mod:`.saves` (the off-step save queue), :mod:`.plans` and :mod:`.metadata`
(scheduler -> worker plans), :mod:`.scheduler` (with its parts :mod:`.steps`,
:mod:`.turnend` and the records they share, :mod:`.tracking`), :mod:`.worker`,
:mod:`.connector`. Only the scheduler side, the worker, the connector and
:mod:`.metadata` import vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["KVStoreConnector"]

if TYPE_CHECKING:
    from kvstore.connectors.vllm.connector import KVStoreConnector


def __getattr__(name: str) -> Any:
    if name == "KVStoreConnector":
        from kvstore.connectors.vllm.connector import KVStoreConnector

        return KVStoreConnector
    raise AttributeError(f"module 'kvstore.connectors.vllm' has no attribute {name!r}")
