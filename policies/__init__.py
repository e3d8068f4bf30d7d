"""Pure keep / offload / drop policies (installed as ``kvstore.policies``).

Registry: a name maps to a lazy import of its class; unknown names are refused
with the list of valid ones. :func:`create` hands the class a
:class:`~kvstore.policies.base.PolicyConfig` (the tiers, the cost model, the HBM
keep limit) and the caller's keyword options; the class's ``from_config`` says
which of those it takes. Nothing is read from constructor signatures.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstore.policies.base import (
    BlockInfo,
    Hint,
    Move,
    Plan,
    Policy,
    PolicyConfig,
    RequestInfo,
    TierSpec,
    Wrapper,
)

if TYPE_CHECKING:
    from kvstore.policies.cost import CostModel

__all__ = ["BlockInfo", "Hint", "Move", "Plan", "Policy", "PolicyConfig", "RequestInfo",
           "TierSpec", "Wrapper", "available", "create", "register"]

_REGISTRY: dict[str, str] = {
    "adaptive": "kvstore.policies.adaptive:AdaptivePolicy",
    "frequency": "kvstore.policies.frequency:FrequencyPolicy",
    "lru": "kvstore.policies.lru:LRUPolicy",
    "lru+filter": "kvstore.policies.filter:FilteredLRU",
    "s3fifo": "kvstore.policies.s3fifo:S3FIFOPolicy",
    "s3fifo+filter": "kvstore.policies.filter:FilteredS3FIFO",
    "ttl": "kvstore.policies.ttl:TTLPolicy",
    "vllm-arc": "kvstore.policies.vllm_native:VLLMNativeARC",
    "vllm-lru": "kvstore.policies.vllm_native:VLLMNativeLRU",
    "workload": "kvstore.policies.workload:WorkloadPolicy",
}


def register(name: str, target: str) -> None:
    """Register ``name`` -> ``"module:Class"``; duplicates are refused."""
    if name in _REGISTRY:
        raise ValueError(f"policy {name!r} is already registered ({_REGISTRY[name]})")
    _REGISTRY[name] = target


def available() -> list[str]:
    return sorted(_REGISTRY)


def create(name: str, tiers: Sequence[TierSpec], cost: CostModel | None = None,
           hbm_keep_max_s: float | None = None, **options: Any) -> Policy:
    """A policy by registry name, built by its class's ``from_config`` from the tiers,
    ``cost`` (the engine's cost model) and ``hbm_keep_max_s`` (the longest HBM keep it
    may decide), with ``options`` as its own keyword settings."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; valid: {', '.join(available())}"
        ) from None
    module_name, _, cls_name = target.partition(":")
    found = getattr(importlib.import_module(module_name), cls_name)
    if not (isinstance(found, type) and issubclass(found, Policy)):
        raise TypeError(f"policy {name!r} ({target}) is not a Policy subclass")
    cls: type[Policy] = found
    return cls.from_config(PolicyConfig(tuple(tiers), cost, hbm_keep_max_s), **options)
