"""Checks every tier applies the same way (sizes, capacity), so the conformance suite holds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar, cast

from kvstore.errors import BlockTooLargeForTier, InvalidBlock, TierFull
from kvstore.types import BlockMeta

__all__ = ["as_bytes_view", "check_put", "check_size", "gather_all", "tier_full"]

_T = TypeVar("_T")


def as_bytes_view(payload: bytes | bytearray | memoryview) -> memoryview:
    """A flat, C-contiguous unsigned-byte view of ``payload`` (no copy)."""
    view = memoryview(payload)
    if not view.c_contiguous:
        raise InvalidBlock("payload must be a C-contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def check_put(name: str, capacity: int, meta: BlockMeta, payload: memoryview) -> int:
    """Validate a put of ``payload`` under ``meta``; return its size in bytes."""
    size = payload.nbytes
    if size == 0:
        raise InvalidBlock(f"block {meta.key}: empty payload")
    if meta.size != size:
        raise InvalidBlock(
            f"block {meta.key}: meta.size is {meta.size} but the payload has {size} bytes"
        )
    check_size(name, capacity, size)
    return size


def check_size(name: str, capacity: int, size: int) -> None:
    if size <= 0:
        raise InvalidBlock(f"block size must be positive, got {size}")
    if size > capacity:
        raise BlockTooLargeForTier(
            f"a {size}-byte block can never fit tier {name!r} "
            f"(capacity {capacity} bytes); raise its capacity or skip this tier"
        )


def tier_full(name: str, size: int, used: int, capacity: int, why: str = "") -> TierFull:
    detail = f" ({why})" if why else ""
    return TierFull(
        f"tier {name!r} has no room for {size} bytes now: {used} of {capacity} bytes used"
        f"{detail}; evict first"
    )


async def gather_all(aws: Sequence[Awaitable[_T]]) -> list[_T]:
    """Run all to completion; then raise the first failure, if any."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return cast(list[_T], results)
