"""The shared tier on the engine's side: blocks other sidecars wrote, found on lookup.

A shared tier (Redis, :class:`~kvstore.tiers.base.SharedTier`) holds blocks this
sidecar's index has never seen. :class:`SharedPrefix` is the engine's part in
that, attached as ``engine.shared`` and called from four places:

* **Lookup** (``Engine.serve_lookup``, after the local lookup): when the local prefix ends
  before the request's hashes do, :meth:`SharedPrefix.extend` probes the shared
  tier for the rest in one round trip. Each leading block found whose load beats
  recomputing its tokens (:class:`~kvstore.policies.cost.CostModel`) is
  *adopted*: room is made in the tier's budget, it is indexed in the shared
  tier, announced as ``BlockStored`` ``REMOTE`` and queued for a prefetch into
  the fastest tier. A later Acquire / Get loads it through the engine's usual
  promotion path, so its bytes are checksum-verified like any other copy.
* **After a store** (the placement's ``after_store``): with ``write_through`` every
  block the policy admitted is copied to the shared tier in the background, so
  other hosts find it at once (otherwise it only gets there when demoted).
* **Sweep** (``Engine.sweep``): blocks whose TTL passed are forgotten
  (``BlockRemoved`` ``REMOTE``); their keys are left alone, since another
  sidecar may have renewed them. Each block's TTL in the shared tier is the
  tier's configured default.

A probe that fails (Redis down, slow) finds nothing: the lookup answers with the
local prefix alone, never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstore.engine.mover import Transfer
from kvstore.errors import ResourceExhausted
from kvstore.tiers.base import SharedTier
from kvstore.types import Medium

if TYPE_CHECKING:
    from kvstore.engine.core import Engine
    from kvstore.engine.index import Entry

__all__ = ["SharedPrefix"]

log = logging.getLogger(__name__)


class SharedPrefix:
    """The engine's hooks for one shared tier (see the module docstring); the engine
    reaches them through :class:`~kvstore.engine.observe.SharedHooks`."""

    def __init__(self, engine: Engine, tier_name: str, *, write_through: bool = True) -> None:
        tier = engine.tiers[tier_name]
        inner = tier.unwrap()
        if not isinstance(inner, SharedTier):
            raise TypeError(f"tier {tier_name!r} is not a shared tier")
        self.engine = engine
        self.name = tier_name
        self.tier: SharedTier = inner
        self.medium: Medium = tier.medium
        self.write_through = write_through
        self._rank = engine.order.index(tier_name)

    def worth_loading(self, namespace: str) -> bool:
        """Whether reading a block of ``namespace`` from the shared tier beats recomputing
        it (the engine's cost model, as for every tier)."""
        return self.engine.geometry.worth(namespace)[self._rank]

    async def extend(self, namespace: str, hashes: Sequence[bytes], start: int,
                     count: bool = True) -> list[Medium]:
        """Media of the blocks after ``hashes[:start]`` (the local prefix) found in the
        shared tier, adopted into the index (``Engine.serve_lookup`` calls it with the
        local prefix's length); ``count=False`` for a repeated lookup of a request (its
        stats were counted)."""
        eng = self.engine
        if start >= len(hashes) or not self.worth_loading(namespace):
            return []
        found = await self.tier.probe(namespace, hashes[start:])
        media: list[Medium] = []
        top = eng.order[0]
        for block in found:
            meta = block.meta
            entry = eng.index.get(meta.key)
            if entry is None:
                try:
                    await eng.placement.make_room(self.name, meta.size, (), namespace)
                except ResourceExhausted as exc:
                    log.info("shared block %s not adopted: %s", meta.key, exc)
                    break
                entry = eng.index.get(meta.key)  # stored meanwhile by another request?
            if entry is None:
                self.tier.adopt(block)
                eng.placement.stored(meta, self.name)
                media.append(self.medium)
                if top != self.name:
                    eng.mover.submit(Transfer(meta.key, self.name, top, keep_src=True,
                                              reason="prefetch"))
            else:
                media.append(eng.tiers[entry.tiers[0]].medium)
        n = len(media)
        if n and count:
            st = eng.stats
            st.lookup_hit_blocks += n
            st.lookup_miss_blocks -= n
            st.tier_hits[self.name] += n
        return media

    def after_store(self, entry: Entry) -> None:
        """Queue the copy of a newly stored block to the shared tier (write-through)."""
        if self.write_through and entry.tiers and self.name not in entry.tiers:
            self.engine.mover.submit(Transfer(entry.key, entry.tiers[0], self.name,
                                              keep_src=True, reason="share"))

    def sweep(self) -> int:
        """Forget the blocks whose TTL passed; returns how many."""
        eng = self.engine
        n = 0
        for key in self.tier.expired():
            entry = eng.index.get(key)
            if entry is None or self.name not in entry.tiers:
                continue
            eng.placement.forget(key, self.name)  # its key is left: others may renew it
            n += 1
        return n
