"""``KVStoreConnector``: vLLM's ``KVConnectorBase_V1`` over the kvstore sidecar.

Load it with::

    --kv-transfer-config '{"kv_connector": "KVStoreConnector",
        "kv_connector_module_path": "kvstore.connectors.vllm",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"address": "127.0.0.1:50051"}}'

The class only dispatches: one instance per process plays one role, the
scheduler side (:mod:`.scheduler`) or the worker side (:mod:`.worker`).
Settings are :class:`~.config.ConnectorConfig`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kvstore.connectors.vllm.config import ConnectorConfig, LayoutFingerprint, namespace_for
from kvstore.connectors.vllm.metadata import KVStoreConnectorMetadata
from kvstore.connectors.vllm.scheduler import SchedulerSide
from kvstore.connectors.vllm.sidecar import SidecarLink
from kvstore.connectors.vllm.worker import WorkerSide, prefault_in_background
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KVStoreConnector", "fingerprint_of"]

logger = logging.getLogger("kvstore.connectors.vllm")


def fingerprint_of(
    vllm_config: VllmConfig, config: ConnectorConfig, tp_rank: int, pp_rank: int = 0
) -> LayoutFingerprint:
    from vllm.platforms import current_platform

    model = vllm_config.model_config
    cache = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    dtype = cache.cache_dtype if cache.cache_dtype != "auto" else str(model.dtype)
    return LayoutFingerprint(
        model=config.model_id or str(model.model),
        dtype=dtype.removeprefix("torch."),
        num_layers=model.get_num_layers(parallel),
        num_kv_heads=model.get_num_kv_heads(parallel),
        head_size=model.get_head_size(),
        block_size=int(cache.block_size),
        tp_rank=tp_rank,
        tp_size=parallel.tensor_parallel_size,
        device=str(current_platform.device_type),
        hash_algo=str(cache.prefix_caching_hash_algo),
        tenant=config.tenant,
        pp_rank=pp_rank,
        pp_size=parallel.pipeline_parallel_size,
    )


def _ensure_log_handler() -> None:
    """Show the connector's INFO lines next to vLLM's, unless the app configured logging."""
    connector_logger = logging.getLogger("kvstore.connectors.vllm")
    if connector_logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [kvstore pid=%(process)d] %(message)s")
    )
    connector_logger.addHandler(handler)
    connector_logger.setLevel(logging.INFO)
    connector_logger.propagate = False


def _ranks() -> tuple[int, int]:
    """This worker's (TP rank, PP rank); (0, 0) outside a distributed group."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return int(get_tp_group().rank_in_group), int(get_pp_group().rank_in_group)
    except Exception:  # groups not initialised (single process): rank 0
        return 0, 0


class KVStoreConnector(KVConnectorBase_V1):
    """Prefix store connector: loads cached prefixes, saves full blocks, hints turns."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        _ensure_log_handler()
        transfer = self._kv_transfer_config
        self.config = ConnectorConfig.from_extra_config(transfer.kv_connector_extra_config)
        if not vllm_config.cache_config.enable_prefix_caching:
            logger.warning("kvstore: prefix caching is off: no block hashes, nothing to store")
        if transfer.kv_load_failure_policy != "recompute":
            logger.warning(
                "kvstore: kv_load_failure_policy=%r fails a request whose load fails "
                "(e.g. a block evicted between lookup and load); set it to 'recompute' "
                "so the engine recomputes instead",
                transfer.kv_load_failure_policy,
            )
        # The scheduler looks up the first worker's shard: all ranks store alike.
        tp_rank, pp_rank = (0, 0) if role == KVConnectorRole.SCHEDULER else _ranks()
        fingerprint = fingerprint_of(vllm_config, self.config, tp_rank, pp_rank)
        self.namespace = namespace_for(fingerprint)
        cfg = self.config
        block_size = int(vllm_config.cache_config.block_size)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            link = SidecarLink(cfg.address, cfg.timeout_s, cfg.retry_interval_s,
                               client_factory=cfg.client_factory())
            self._scheduler = SchedulerSide(
                cfg, link, self.namespace, block_size,
                cache_blocks=int(vllm_config.cache_config.num_gpu_blocks or 0),
            )
        else:
            link = SidecarLink(
                cfg.address,
                cfg.timeout_s,
                cfg.retry_interval_s,
                client_factory=cfg.client_factory(),
                on_connect=prefault_in_background if cfg.prefault else None,
            )
            self._worker = WorkerSide(
                link,
                self.namespace,
                kv_cache_config.num_blocks,
                block_size,
                cfg.timeout_s,
                cfg.host_threads,
            )
        logger.info(
            "kvstore: %s side, sidecar %s, namespace %s",
            role.name.lower(),
            self.config.address,
            self.namespace,
        )

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped save is a future miss

    # ==== worker side ====
    def _meta(self) -> KVStoreConnectorMetadata:
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, KVStoreConnectorMetadata) else KVStoreConnectorMetadata()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self._worker is not None:
            self._worker.register_kv_caches(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self._worker is not None and isinstance(kv_connector_metadata, KVStoreConnectorMetadata):
            self._worker.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if self._worker is not None and self.has_connector_metadata():
            self._worker.start_load_kv(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:
            self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return  # whole blocks, all layers at once, off the step (wait_for_save)

    def wait_for_save(self) -> None:
        if self._worker is not None and self.has_connector_metadata():
            self._worker.wait_for_save(self._meta())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        idle = self.has_connector_metadata() and self._meta().idle
        return self._worker.get_finished(finished_req_ids, idle)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def build_connector_worker_meta(self) -> Any:
        return self._worker.take_report() if self._worker is not None else None

    # ==== scheduler side ====
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if self._scheduler is None:
            return 0, False
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if self._scheduler is not None:
            self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self._scheduler is None:
            return KVStoreConnectorMetadata()
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._scheduler is not None:
            self._scheduler.update_connector_output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler is None:
            return False, None
        return self._scheduler.request_finished(request, block_ids)

    def reset_cache(self) -> bool | None:
        return None  # the sidecar outlives the engine's prefix cache on purpose

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._worker is not None:
            self._worker.shutdown()
