"""Storage tiers behind one interface (:mod:`kvstore.tiers.base`).

Implementations are imported lazily (the DRAM tier pulls numpy, the disk tier
msgspec/xxhash): ``from kvstore.tiers import DramTier`` imports only that module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kvstore.tiers.base import PersistentTier, Slot, SlotTier, Tier

if TYPE_CHECKING:
    from kvstore.tiers.disk.tier import DiskTier
    from kvstore.tiers.dram import DramTier
    from kvstore.tiers.memory import MemoryTier

__all__ = ["DiskTier", "DramTier", "MemoryTier", "PersistentTier", "Slot", "SlotTier", "Tier"]

_LAZY = {
    "DiskTier": "kvstore.tiers.disk.tier",
    "DramTier": "kvstore.tiers.dram",
    "MemoryTier": "kvstore.tiers.memory",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvstore.tiers' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
