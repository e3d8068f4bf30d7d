"""An in-memory tier: a dict of bytes with an exact byte capacity.

A real implementation (not a mock): tests use it everywhere, and it is a valid
tier for a process that needs no sharing and no persistence.
"""

from __future__ import annotations

from kvstore.errors import BlockNotFound
from kvstore.tiers._common import as_bytes_view, check_put, tier_full
from kvstore.tiers.base import Tier
from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["MemoryTier"]


class MemoryTier(Tier):
    """Blocks kept as ``bytes`` in a dict; ``put`` copies, ``get`` returns the bytes."""

    def __init__(self, capacity_bytes: int, name: str = "memory", medium: Medium = Medium.CPU):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.name = name
        self.medium = medium
        self._capacity = capacity_bytes
        self._used = 0
        self._blocks: dict[BlockKey, bytes] = {}

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        return self._used

    def can_fit(self, size: int) -> bool:
        return 0 < size <= self._capacity - self._used

    async def put(self, meta: BlockMeta, payload: bytes | memoryview) -> None:
        if type(payload) is bytes:  # immutable: kept as it is, no copy
            data = payload
            size = check_put(self.name, self._capacity, meta, memoryview(data))
        else:
            view = as_bytes_view(payload)
            size = check_put(self.name, self._capacity, meta, view)
            data = view.tobytes()
        old = self._blocks.get(meta.key)
        freed = len(old) if old is not None else 0
        if self._used - freed + size > self._capacity:
            raise tier_full(self.name, size, self._used, self._capacity)
        self._blocks[meta.key] = data
        self._used += size - freed

    async def get(self, key: BlockKey) -> bytes:
        try:
            return self._blocks[key]
        except KeyError:
            raise BlockNotFound(f"block {key} is not in tier {self.name!r}") from None

    async def contains(self, key: BlockKey) -> bool:
        return key in self._blocks

    async def delete(self, key: BlockKey) -> bool:
        old = self._blocks.pop(key, None)
        if old is None:
            return False
        self._used -= len(old)
        return True

    async def close(self) -> None:
        self._blocks.clear()
        self._used = 0
