"""A vLLM KV connector that does nothing: what any connector costs an engine.

``kv_connector_module_path="tests.vllm.noop_connector"``,
``kv_connector="NoopConnector"`` (the repository root on ``sys.path``). Used
by ``bench_connector_overhead.py`` to tell vLLM's own per-step cost of having
a connector from kvstore's.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

__all__ = ["NoopConnector"]


class NoopConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.HOST

    @property
    def requires_kv_delivery(self) -> bool:
        return False

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, *args: Any) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()
