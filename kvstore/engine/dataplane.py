"""The shared-memory data plane, on the engine's side.

Co-located clients never send payload bytes through gRPC: they *reserve*
slots in the DRAM tier's shared-memory segment, write them, and *commit* by
descriptor; to read they *acquire* a lease on the slots of stored blocks, copy
the bytes out and *release*. The engine stays the one owner of the blocks'
lifecycle: this class only drives its primitives for the slot tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable, Sequence

import xxhash

from kvstore.engine.blocks import NewBlock, check_payload, new_meta
from kvstore.engine.core import Engine
from kvstore.engine.leases import Reservation
from kvstore.engine.pace import Pace
from kvstore.engine.slotreads import SlotReads
from kvstore.engine.store import StoreOp
from kvstore.errors import (
    BadDescriptor,
    InvalidArgument,
    InvalidBlock,
    KVStoreError,
    QuotaExceeded,
    TierFull,
)
from kvstore.tiers.base import Slot, SlotTier, Tier
from kvstore.types import BlockKey, BlockMeta, Workload, check_hash

__all__ = ["SlotPlane"]

log = logging.getLogger(__name__)

#: Slots of a commit whose checksums the writer did not send are hashed on the event
#: loop only up to this many bytes in all (~20 us); more go to a worker thread.
INLINE_HASH_BYTES = 256 * 2**10


class SlotPlane(SlotReads):
    """Reserve, commit and abort (the writes, here) and acquire, release and verify
    (the reads, :class:`~kvstore.engine.slotreads.SlotReads`) over one slot tier."""

    def __init__(self, engine: Engine, tier: Tier) -> None:
        inner = tier.unwrap()
        if not isinstance(inner, SlotTier):
            raise TypeError(f"tier {tier.name!r} has no shared-memory slots")
        self.engine = engine
        self.tier = tier
        self.slots: SlotTier = inner

    @classmethod
    def for_engine(cls, engine: Engine) -> SlotPlane | None:
        """The plane of the engine's shared-memory tier (None without one), attached
        to the engine as the holder its lookups pin blocks with."""
        for name in engine.order:
            if isinstance(engine.tiers[name].unwrap(), SlotTier):
                plane = engine.plane = cls(engine, engine.tiers[name])
                return plane
        return None

    def segments(self) -> list[tuple[str, int]]:
        return self.slots.segments()

    async def reserve(self, namespace: str, items: Sequence[tuple[bytes, int]],
                      owner: str = "", session_id: str = "", workload: str = "",
                      request_id: Hashable = "") -> list[Slot | None]:
        """Slots for clients to write; ``None`` for blocks not to write: already
        stored, refused by the policy's plan for their request, or bound for another
        tier while this one has no free room to stage them. The reservations belong to
        ``owner`` (the caller's identity).

        The store pipeline's plan and room steps (:mod:`kvstore.engine.store`); the
        slot is the room. All or nothing: when a block bound here gets no room, or
        what holds the room is this call's own slots, every slot it reserved is freed
        and TierFull raised (the client retries in smaller batches)."""
        eng = self.engine
        store = eng.store
        eng.durability.check_accepting()
        hashes = eng.check_hashes(namespace, [h for h, _ in items], unique=True)
        Workload.parse(workload)
        sizes = [size for _, size in items]
        if sizes and not 0 < min(sizes) <= max(sizes) <= eng.max_block_bytes:
            for h, size in items:  # (the one that is not, named)
                check_payload(h, size, eng.max_block_bytes)
        op = store.plan(namespace, hashes, sizes, session_id, workload, request_id)
        target_of = op.target_of()
        now = eng.clock()
        out: list[Slot | None] = []
        #: bytes this call reserved in the tier for the block's own use (its tenant's
        #: quota counts them before they are committed and indexed)
        pending = 0
        # Room is made (evicting, checking the tenant's quota) only for a block the
        # tier has no free range for: most reserves take their slots from the free
        # room at once, all of them out of one free range where one holds them (one
        # allocator search for the request), and make no eviction pass.
        quotas = bool(eng.placement.quotas)
        wanted = [size for i, (_, size) in enumerate(items) if target_of.get(i) is not None]
        run = (self.slots.reserve_run(wanted) if len(wanted) > 1 and not quotas else None) or []
        run.reverse()  # handed out in order, from the end
        pace = Pace()
        try:
            for i, (h, size) in enumerate(items):
                if pace.due():
                    await pace.pause()  # let other calls in (loop lag)
                target = target_of.get(i)
                if target is None:
                    out.append(None)
                    continue
                here = target == self.tier.name
                if run:
                    new: Slot | None = run.pop()
                elif here and quotas:
                    new = None  # its tenant's quota is checked first (room)
                else:
                    new = self._take(size)
                if new is None and not here:
                    # Bound for another tier: the slot only stages its bytes until the
                    # commit copies them there. Without free room, the policy's least
                    # valuable block here makes it (demoted where the policy says), so
                    # a full tier never stops blocks bound below it. If what holds the
                    # room is this call's own slots, TierFull (the client retries in
                    # smaller batches); otherwise the block is not stored this time.
                    try:
                        await store.room(op, self.tier.name, size, quota=False)
                    except TierFull:
                        if any(slot is not None for slot in out):
                            raise
                        out.append(None)
                        continue
                elif new is None:
                    try:
                        await store.room(op, self.tier.name, size, pending=pending)
                    except QuotaExceeded:
                        # the tenant is at its quota here: this block and the rest of
                        # its chain are not stored this time
                        out.extend([None] * (len(items) - i))
                        break
                if here:
                    pending += size
                if new is None:
                    new = self.slots.reserve(size)
                eng.leases.add_reservation(Reservation(
                    BlockKey(namespace, h), new, self.tier.name, now + eng.lease_seconds, owner,
                    target))
                out.append(new)
        except BaseException:  # all or nothing: free what this call reserved
            for slot in out:
                if slot is not None:
                    eng.leases.take_reservation(slot.slot_id, now, owner)
                    self.slots.abort(slot)
            for slot in run:  # reserved in the tier, not handed out yet
                self.slots.abort(slot)
            raise
        return out

    def _take(self, size: int) -> Slot | None:
        """A slot from the tier's free room as it is (None: no free range holds one)."""
        try:
            return self.slots.reserve(size)
        except TierFull:
            return None

    def view(self, slot: Slot) -> memoryview:
        return self.slots.view(slot)

    async def commit(self, namespace: str, items: Sequence[tuple[Slot | int, NewBlock]],
                     session_id: str = "", workload: str = "", owner: str = "",
                     request_id: Hashable = "", checksums: Sequence[int] = ()) -> int:
        """Commit written slots: ``items`` are (descriptor as reserved, or the slot's id
        alone, block; its payload is ignored: the bytes are read from the slot). A block
        the plan put in another tier is copied there from its slot, and the slot freed.

        ``checksums``: the writer's xxh3-64 of each slot as written (0 or absent: not
        given). A given one is recorded as it is, without reading the slot: every
        read checks the bytes against it (the client's in-place reads, a gRPC Get, a
        copy to disk or Redis), so a writer whose checksum does not match what it
        wrote has its block refused and dropped at the first read. The ones not given
        are computed off the event loop (:meth:`_digests`)."""
        eng = self.engine
        eng.durability.check_accepting()
        Workload.parse(workload)
        eng.check_hashes(namespace, [b.block_hash for _, b in items], unique=True)
        for _, b in items:
            if b.parent_hash:
                check_hash(b.parent_hash, "parent_hash")
            if len(b.token_ids) > eng.max_block_tokens:
                raise InvalidBlock(
                    f"block {bytes(b.block_hash).hex()[:16]} carries {len(b.token_ids)} token "
                    f"ids; at most {eng.max_block_tokens} (server.max_block_tokens)")
        slots = self._described(items)
        digests = await self._digests(slots, checksums)
        store = eng.store
        op = store.resume(namespace, [b.block_hash for _, b in slots], session_id, workload,
                          request_id)
        #: blocks committed in their slots and not indexed yet: indexed (and the policy,
        #: the events and the write-back told) together, before anything awaits, so no
        #: other call sees a committed slot the index does not hold
        done: list[BlockMeta] = []
        try:
            await self._commit_each(slots, digests, op, owner, done)
        finally:
            self._place(op, done)
        store.finish(op)
        if eng.profile is not None:
            eng.profile.on_store((d.length, len(blk.token_ids)) for d, blk in slots)
        return len(op.placed)

    def _described(self, items: Sequence[tuple[Slot | int, NewBlock]]
                   ) -> list[tuple[Slot, NewBlock]]:
        """``items`` with each slot given by id alone replaced by its reservation's
        descriptor (the one Reserve handed out: nothing to build or compare). An id with
        no live reservation gets an empty descriptor, which the commit refuses."""
        peek = self.engine.leases.peek_reservation
        out: list[tuple[Slot, NewBlock]] = []
        for desc, b in items:
            if isinstance(desc, int):
                r = peek(desc)
                desc = r.slot if r is not None else Slot(desc, "", 0, 0)
            out.append((desc, b))
        return out

    async def _commit_each(self, items: Sequence[tuple[Slot, NewBlock]], digests: list[int],
                           op: StoreOp, owner: str, done: list[BlockMeta]) -> None:
        """The commit of each slot in turn; those that stay here are added to ``done``
        (and placed by the caller's batch, or here before each await)."""
        eng = self.engine
        store = eng.store
        namespace = op.namespace
        here = self.tier.name
        now = eng.clock()
        pace = Pace()
        for i, (desc, b) in enumerate(items):
            if pace.due(len(done)):
                # (what was committed is placed before anything else runs)
                await pace.pause(lambda: self._place(op, done), len(done))  # loop lag
                now = eng.clock()
            r = eng.leases.take_reservation(desc.slot_id, now, owner)
            if desc is not r.slot and desc != r.slot:
                eng.leases.add_reservation(r)
                self.slots.check_descriptor(desc.segment, desc.offset, desc.length)
                raise BadDescriptor(
                    f"descriptor {desc.segment}@{desc.offset}+{desc.length} does not match "
                    f"the reservation of slot {desc.slot_id} "
                    f"({r.slot.segment}@{r.slot.offset}+{r.slot.length})"
                )
            if r.key.block_hash != b.block_hash or r.key.namespace != namespace:
                eng.leases.add_reservation(r)
                raise InvalidBlock(
                    f"slot {desc.slot_id} was reserved for {r.key}, not "
                    f"{namespace}/{bytes(b.block_hash).hex()}"
                )
            if eng.index.get_hash(namespace, b.block_hash) is not None:
                self.slots.abort(r.slot)  # a concurrent writer won; keep the first copy
                continue
            # (the slot's bytes are read only to hash them or to copy them elsewhere:
            # most commits carry the writer's checksum and stay here)
            meta = new_meta(namespace, b, digests[i] or xxhash.xxh3_64_intdigest(
                self.slots.view(r.slot)), op.session_id, op.workload, size=r.slot.length,
                key=r.key)
            if r.target != here and r.target is not None:
                self._place(op, done)
                view = self.slots.view(r.slot)
                try:
                    copied = await store.store(op, meta, view, r.target)
                except QuotaExceeded as exc:
                    # its tenant is at its quota in the target tier: this block and the
                    # rest of its chain are not stored; their slots are freed
                    log.info("commit stops at %s: %s", meta.key, exc)
                    self.slots.abort(r.slot)
                    for rest, _ in items[i + 1:]:
                        with contextlib.suppress(KVStoreError):
                            self.abort([rest.slot_id], owner)
                    break
                except BaseException:
                    self.slots.abort(r.slot)
                    raise
                if copied is not None:
                    self.slots.abort(r.slot)
                    continue
                # a persistent target without its prefix: kept here, written back after
            self.slots.commit(r.slot, meta)
            done.append(meta)

    def _place(self, op: StoreOp, done: list[BlockMeta]) -> None:
        """Place the blocks committed in their slots since the last time (``done``,
        emptied): indexed, and the policy, the events and the write-back told."""
        if done:
            self.engine.store.placed_many(op, done, self.tier.name)
            done.clear()

    async def _digests(self, items: Sequence[tuple[Slot, NewBlock]], given: Sequence[int]
                       ) -> list[int]:
        """Each slot's checksum: the writer's where given, else its xxh3-64, taken on a
        worker thread (xxhash lets go of the GIL) unless the slots are small. A slot
        without a live reservation matching its descriptor is left at 0 (the commit
        refuses it)."""
        out = [int(c) for c in given] if given else [0] * len(items)
        if len(out) != len(items):
            raise InvalidArgument(f"{len(out)} checksums for {len(items)} slots")
        todo: list[tuple[int, memoryview]] = []
        for i, (desc, _) in enumerate(items):
            if out[i]:
                continue
            r = self.engine.leases.peek_reservation(desc.slot_id)
            if r is not None and r.slot == desc:
                todo.append((i, self.slots.view(r.slot)))
        if not todo:
            return out
        views = [v for _, v in todo]
        if sum(len(v) for v in views) <= INLINE_HASH_BYTES:
            sums = [xxhash.xxh3_64_intdigest(v) for v in views]
        else:
            sums = await asyncio.to_thread(lambda: [xxhash.xxh3_64_intdigest(v) for v in views])
        for (i, _), digest in zip(todo, sums, strict=True):
            out[i] = digest
        return out

    def abort(self, slot_ids: Sequence[int], owner: str = "") -> None:
        now = self.engine.clock()
        for sid in slot_ids:
            self.slots.abort(self.engine.leases.take_reservation(sid, now, owner).slot)
