"""The store pipeline: the one engine operation behind every way bytes come in.

A store runs five steps, written once here:

1. **plan** (:meth:`StorePipeline.plan`): refuse it while draining; split the
   blocks into held and new; ask the request's admission plan where each new block
   may go (:class:`~kvstore.engine.planning.Planner`); the request's own blocks are
   protected from the room its store makes; the session the blocks are recorded
   under.
2. **room** (:meth:`StorePipeline.room`): evict (the policy's victims, demoted where
   it says; the tenant's own first while over its quota) until the block fits. When
   nothing can go because what holds the tier is being copied out (write-back, done
   within milliseconds), wait up to :data:`BUSY_WAIT_S` rather than refuse.
3. **store, index, events, write-back** (:meth:`StorePipeline.store` for bytes in
   hand, :meth:`StorePipeline.placed` for bytes a client already wrote into a
   shared-memory slot): a persistent tier takes a block only after its prefix; the
   block is indexed, the policy and the event stream are told, and its write-back
   (and write-through to a shared tier) is queued.
4. **finish** (:meth:`StorePipeline.finish`): the chain is touched tail first, as
   vLLM frees it.

Two front ends drive it. ``Engine.put`` (gRPC, the replay) runs all steps at once
(:meth:`StorePipeline.put`). The shared-memory plane
(:class:`~kvstore.engine.dataplane.SlotPlane`) runs *plan* and *room* at Reserve
(the room is the slot it hands out) and the rest at Commit.

What happens when a block gets no room is decided here too, once: the chain stops
there (its later blocks would extend a missing prefix), the blocks before stay
stored, and if none was stored the store fails with TierFull; a tenant at its quota
stops the chain the same way. The connector (Reserve / Commit) runs exactly that.
``spill=True`` (the default of ``Engine.put``, kept for gRPC clients and the trace
replay's figures) first tries the rest of the chain in the next tier down, and
makes the room for each run of blocks bound for one tier at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import xxhash

from kvstore.engine.blocks import NewBlock, new_meta
from kvstore.engine.index import Entry
from kvstore.engine.placement import Placement
from kvstore.engine.planning import Planner
from kvstore.engine.writeback import WriteBack
from kvstore.errors import QuotaExceeded, TierFull, Unavailable
from kvstore.types import BlockKey, BlockMeta, Workload

__all__ = ["BUSY_WAIT_S", "StoreOp", "StorePipeline"]

#: How long making room waits for copies out of a full tier (write-back) to end when
#: nothing else there can make room, before it gives up with TierFull.
BUSY_WAIT_S = 1.0

log = logging.getLogger("kvstore.engine")


@dataclass(slots=True)
class StoreOp:
    """One store in progress: what its plan step decided, and what it placed so far."""

    namespace: str
    workload: Workload
    #: The session the new blocks are recorded under.
    session_id: str
    #: Keys the room this store makes must not evict (the request's own blocks).
    protect: set[Hashable]
    #: Whether a block that gets no room in its tier tries the next one down.
    spill: bool
    #: Positions (in the caller's list) of the blocks to store, and each one's tier
    #: from the plan (None: refused).
    fresh: list[int] = field(default_factory=list)
    targets: list[str | None] = field(default_factory=list)
    #: Blocks the index held already.
    existing: list[Entry] = field(default_factory=list)
    placed: list[Entry] = field(default_factory=list)

    def target_of(self) -> dict[int, str | None]:
        return dict(zip(self.fresh, self.targets, strict=True))


class StorePipeline:
    """The store operation over the engine's placement and planner."""

    def __init__(self, placement: Placement, durability: WriteBack, planner: Planner) -> None:
        self.placement = placement
        self.durability = durability
        self.planner = planner
        self.geometry = planner.geometry

    # -- 1. plan ------------------------------------------------------------------------
    def plan(self, namespace: str, hashes: Sequence[bytes], sizes: Sequence[int],
             session_id: str, workload: str, request_id: Hashable, *,
             num_tokens: Sequence[int] = (), parent: bytes | None = None,
             spill: bool = False) -> StoreOp:
        """Plan the store of ``hashes`` (payload ``sizes``; ``num_tokens`` per block
        when known: the last new one may be partial). A block whose dropped copy is
        still held (:meth:`~kvstore.engine.placement.Placement.free_pending`) is left
        out: storing it now would race the deferred free; it is stored next time."""
        pl = self.placement
        self.durability.check_accepting()
        wl = Workload.parse(workload)
        now = pl.clock()
        held = pl.index.blocks_of(namespace)
        op = StoreOp(namespace, wl, "", set(), spill)
        for i, h in enumerate(hashes):
            e = held.get(h)
            if e is not None:
                op.existing.append(e)
            elif not pl.free_pending(BlockKey(namespace, h)):
                op.fresh.append(i)
        last = num_tokens[op.fresh[-1]] if op.fresh and num_tokens else 0
        planner = self.planner
        op.targets = planner.admissions(
            namespace, [hashes[i] for i in op.fresh], last, session_id, wl.value, request_id,
            now, max((sizes[i] for i in op.fresh), default=0))
        op.protect = planner.request_keys(namespace, hashes, request_id, parent)
        op.session_id = planner.meta_session(namespace, session_id, request_id, hashes)
        return op

    def resume(self, namespace: str, hashes: Sequence[bytes], session_id: str, workload: str,
               request_id: Hashable) -> StoreOp:
        """The op of a store planned earlier (a Commit of what a Reserve planned)."""
        planner = self.planner
        return StoreOp(namespace, Workload.parse(workload),
                       planner.meta_session(namespace, session_id, request_id, hashes),
                       planner.request_keys(namespace, hashes, request_id), False)

    # -- 2. room --------------------------------------------------------------------------
    async def room(self, op: StoreOp, tier: str, size: int, *, quota: bool = True,
                   pending: int = 0) -> None:
        """Make room for ``size`` bytes in ``tier`` (with ``quota``: within the tenant's
        quota there, counting ``pending`` bytes it holds there but not in the index
        yet). Raises TierFull (QuotaExceeded) when it cannot be made."""
        pl = self.placement
        deadline = time.monotonic() + BUSY_WAIT_S
        namespace = op.namespace if quota else ""
        while True:
            try:
                await pl.make_room(tier, size, op.protect, namespace, pending)
                return
            except QuotaExceeded:
                raise
            except TierFull:
                # seen as a put of 10 MiB into a 4 MiB tier in front of a disk failing
                # about once in 25 runs: room frees up as soon as the copies end
                if not pl.copying(tier) or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.005)

    # -- 3. store, index, events, write-back ------------------------------------------------
    async def store(self, op: StoreOp, meta: BlockMeta, payload: bytes | memoryview,
                    tier: str, *, room_made: bool = False) -> Entry | None:
        """Store one block's bytes in ``tier`` (room made first, unless ``room_made``).
        None: not stored, ``tier`` is persistent and the block's prefix cannot be
        made durable there first."""
        pl = self.placement
        if not await pl.prefix_held(meta, tier, op.protect):
            return None
        if not room_made:
            await self.room(op, tier, meta.size)
        await pl.put_into(tier, meta, payload)
        return self.placed(op, meta, tier)

    def placed(self, op: StoreOp, meta: BlockMeta, tier: str) -> Entry:
        """Index a block whose bytes are in ``tier`` now, tell the policy and the event
        stream, and queue its write-back."""
        return self.placed_many(op, (meta,), tier)[0]

    def placed_many(self, op: StoreOp, metas: Sequence[BlockMeta], tier: str) -> list[Entry]:
        """:meth:`placed` of blocks whose bytes are all in ``tier`` now, in order, each
        step once for all of them (a commit's blocks: no per-block calls through the
        placement, the policy and the event stream)."""
        pl = self.placement
        entries = pl.stored_many(metas, tier)
        observe = self.geometry.observe
        for meta in metas:
            observe(meta.key.namespace, meta.size, meta.num_tokens)
        pl.after_store_many(entries)
        op.placed.extend(entries)
        pl.stats.bytes_in += sum(meta.size for meta in metas)
        return entries

    # -- 4. finish ----------------------------------------------------------------------------
    def finish(self, op: StoreOp) -> None:
        entries = op.existing + op.placed
        self.touch_tail_first(entries)
        pl = self.placement
        if entries:  # (the policy's models of the engine store the request's blocks now)
            pl.policy.on_stored([e.key for e in entries], pl.clock())
        pl.stats.puts += 1

    def touch_tail_first(self, entries: Sequence[Entry]) -> None:
        """Touch a chain's blocks last to first, as vLLM frees them: under pressure
        a chain then loses its tail before its head."""
        pl = self.placement
        held = [entry for entry in reversed(entries) if entry.tiers]
        if held:  # one policy call for the request's blocks, not one per block
            pl.policy.on_access_many([e.key for e in held], [e.tiers[0] for e in held],
                                     pl.clock())

    # -- the put front end: every step at once ------------------------------------------
    async def put(self, namespace: str, blocks: Sequence[NewBlock], session_id: str,
                  workload: str, request_id: Hashable, *, spill: bool) -> tuple[int, int]:
        """Store blocks whose bytes are in hand (see ``Engine.put``)."""
        op = self.plan(namespace, [b.block_hash for b in blocks],
                       [len(b.payload) for b in blocks], session_id, workload, request_id,
                       num_tokens=[b.num_tokens for b in blocks],
                       parent=blocks[0].parent_hash if blocks else None, spill=spill)
        metas: list[BlockMeta] = []
        payloads: list[bytes | memoryview] = []
        tiers: list[str] = []
        for i, tier in zip(op.fresh, op.targets, strict=True):
            if tier is None:
                continue  # refused
            b = blocks[i]
            metas.append(new_meta(namespace, b, xxhash.xxh3_64_intdigest(b.payload),
                                  op.session_id, op.workload))
            payloads.append(b.payload)
            tiers.append(tier)
        start = 0
        while start < len(metas):
            end = start + 1
            if spill:  # consecutive blocks bound for one tier are stored as a run
                while end < len(metas) and tiers[end] == tiers[start]:
                    end += 1
            if not await self._run(op, metas[start:end], payloads[start:end], tiers[start]):
                break
            start = end
        self.finish(op)
        return len(op.placed), len(op.existing)

    async def _run(self, op: StoreOp, metas: list[BlockMeta],
                   payloads: list[bytes | memoryview], tier: str) -> bool:
        """Store a run of a chain's blocks in ``tier``; False once a block could not be
        stored (the rest of the chain is skipped: it would extend a missing prefix).
        With ``op.spill`` the room for the whole run is made at once, and where it
        cannot be the rest of the run goes to the next tier."""
        pl = self.placement
        ns = op.namespace
        room = False
        if op.spill:
            total = sum(m.size for m in metas)
            with contextlib.suppress(TierFull):
                await pl.make_room(tier, min(total, pl.tiers[tier].capacity_bytes),
                                   op.protect, ns)
            room = pl.tiers[tier].can_fit(total) and pl.fits_quota(ns, tier, total)
        get = pl.index.get_hash
        for i, (meta, payload) in enumerate(zip(metas, payloads, strict=True)):
            if get(ns, meta.key.block_hash) is not None:
                continue  # a concurrent put stored it meanwhile
            try:
                if await self.store(op, meta, payload, tier, room_made=room) is None:
                    return False  # a persistent tier lacks its prefix, and cannot get it
            except TierFull as exc:
                # What is left here is pinned, in flight or this request's own blocks
                # (or the tenant is at its quota): the chain stops, or spills below.
                nxt = pl.rank(tier) + 1
                if op.spill and nxt < len(pl.order):
                    return await self._run(op, metas[i:], payloads[i:], pl.order[nxt])
                pl.stats.puts_cut += 1
                if not op.placed and (op.spill or not isinstance(exc, QuotaExceeded)):
                    raise
                return False
            except Unavailable as exc:  # e.g. the shared tier is down: not stored, no error
                log.warning("block %s not stored in %s: %s", meta.key, tier, exc)
                return False
        return True
