"""Fixtures the engine tests share: a DRAM tier's slot plane with blocks committed in it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import pytest
import xxhash
from kvstore.policies import TierSpec
from kvstore.policies.base import Policy
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.blocks import NewBlock
from kvstore.engine.core import Engine
from kvstore.engine.dataplane import SlotPlane
from kvstore.events import RecordingSink
from kvstore.tiers.dram import DramTier
from kvstore.types import BlockKey

from .test_engine import Clock, new_blocks


@dataclass
class Committed:
    """An engine over one DRAM tier whose slot plane stored ``blocks`` (all committed)."""

    eng: Engine
    plane: SlotPlane
    dram: DramTier
    policy: Policy
    blocks: list[NewBlock]

    @property
    def keys(self) -> list[BlockKey]:
        return [BlockKey("ns", bytes(b.block_hash)) for b in self.blocks]


PlaneFactory = Callable[..., Awaitable[Committed]]


def written_items(plane: SlotPlane, slots: Sequence[object], blocks: Sequence[NewBlock]
                  ) -> list[tuple[object, NewBlock]]:
    """Each block's payload written into its reserved slot; the commit's items."""
    items = []
    for slot, b in zip(slots, blocks, strict=True):
        assert slot is not None
        plane.view(slot)[:] = b.payload  # type: ignore[arg-type]
        items.append((slot, NewBlock(b.block_hash, b.parent_hash, b.token_ids, b"")))
    return items


@pytest.fixture
def committed_plane() -> PlaneFactory:
    """``await committed_plane(capacity, n, size=, seed=, policy=, checksums=)``: a DRAM
    tier of ``capacity`` bytes (policy LRU unless ``policy(tiers)`` makes another) with
    ``n`` blocks of ``size`` bytes reserved, written and committed through its slot
    plane (with the writer's checksums when ``checksums``)."""

    async def make(capacity: int, n: int, *, size: int = 4096, seed: int = 0,
                   policy: Callable[[list[TierSpec]], Policy] = LRUPolicy,
                   checksums: bool = False) -> Committed:
        dram = DramTier(capacity, segment_prefix="kvtest")
        pol = policy([TierSpec(dram.name, dram.capacity_bytes)])
        eng = Engine([dram], pol, RecordingSink(), clock=Clock())
        plane = SlotPlane(eng, dram)
        blocks = new_blocks(n, size=size, seed=seed)
        slots = await plane.reserve("ns", [(b.block_hash, len(b.payload)) for b in blocks])
        items = written_items(plane, slots, blocks)
        sums = [xxhash.xxh3_64_intdigest(b.payload) for b in blocks] if checksums else []
        assert await plane.commit("ns", items, checksums=sums) == n  # type: ignore[arg-type]
        return Committed(eng, plane, dram, pol, blocks)

    return make
