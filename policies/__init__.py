"""Pure keep / offload / drop policies (installed as ``kvstore.policies``).

Registry: a name maps to a lazy import; unknown names are refused with the list
of valid ones.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence

from kvstore.policies.base import BlockInfo, Hint, Move, Plan, Policy, RequestInfo, TierSpec

__all__ = ["BlockInfo", "Hint", "Move", "Plan", "Policy", "RequestInfo", "TierSpec", "available",
           "create", "register"]

_REGISTRY: dict[str, str] = {
    "adaptive": "kvstore.policies.adaptive:AdaptivePolicy",
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


def create(name: str, tiers: Sequence[TierSpec], cost: object = None,
           hbm_keep_max_s: float | None = None, **options: object) -> Policy:
    """A policy by registry name; ``cost`` (a CostModel) and ``hbm_keep_max_s`` (the
    longest HBM keep it may decide) go to policies that take them."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; valid: {', '.join(available())}"
        ) from None
    module_name, _, cls_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    if cost is not None and "cost" in inspect.signature(cls).parameters:
        options["cost"] = cost
    if hbm_keep_max_s is not None and "hbm_keep_max_s" in inspect.signature(cls).parameters:
        options["hbm_keep_max_s"] = hbm_keep_max_s
    policy: Policy = cls(tiers, **options)
    return policy
