"""The engine: one owner for every block's lifecycle.

It keeps the index (which block is in which tier), enforces capacity by asking
the policy for victims, pins blocks that are being read or moved, runs the
two-phase store of the shared-memory plane (reserve -> client writes ->
commit) and read leases, queues transfers on the mover, and emits a placement
event for every change. Tiers only store bytes; policies only decide.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import xxhash

from kvstore.engine.blocks import NewBlock, block_info, check_blocks, new_meta
from kvstore.engine.index import Entry, Index, reachable
from kvstore.engine.leases import Leases
from kvstore.engine.mover import Mover, Transfer
from kvstore.engine.stats import EngineStats
from kvstore.errors import (
    BlockNotFound,
    DataCorruption,
    InvalidArgument,
    TierFull,
    Unavailable,
)
from kvstore.events import EventSink, NullSink
from kvstore.policies import BlockInfo, Hint, Move, Policy
from kvstore.tiers._common import check_size
from kvstore.tiers.base import SlotTier, Tier
from kvstore.types import BlockKey, BlockMeta, Medium, Workload

if TYPE_CHECKING:
    from kvstore.engine.shared import SharedPrefix

__all__ = ["Engine", "NewBlock"]  # NewBlock re-exported from kvstore.engine.blocks

log = logging.getLogger(__name__)

_MAX_EVICTION_ROUNDS = 64


class Engine:
    def __init__(
        self,
        tiers: Sequence[Tier],
        policy: Policy,
        events: EventSink | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        lease_seconds: float = 30.0,
        max_block_bytes: int = 64 * 2**20,
        write_back: bool = True,
        max_hashes: int = 131_072,
        max_block_tokens: int = 8192,
        max_lease_seconds: float = 300.0,
        max_pinned_fraction: float = 0.75,
        quarantine_seconds: float | None = None,
    ) -> None:
        if not tiers:
            raise ValueError("the engine needs at least one tier")
        self.tiers: dict[str, Tier] = {t.name: t for t in tiers}
        self.order = [t.name for t in tiers]
        self._rank = {name: i for i, name in enumerate(self.order)}
        self.policy = policy
        self.events: EventSink = events or NullSink()
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.max_block_bytes = max_block_bytes
        self.write_back = write_back
        #: Hashes (or blocks) one call may carry: Lookup, Get, Acquire, Reserve, Delete.
        self.max_hashes = max_hashes
        #: Token ids one block may carry (they are kept in memory with its metadata).
        self.max_block_tokens = max_block_tokens
        self.max_lease_seconds = max_lease_seconds
        #: Share of a shared-memory tier read leases may pin; past it blocks are
        #: served over gRPC, so readers can never starve writers of slots.
        self.max_pinned_fraction = max_pinned_fraction
        #: How long a slot whose reservation expired stays unused (a stalled writer
        #: may still be writing it).
        self.quarantine_seconds = (2 * lease_seconds if quarantine_seconds is None
                                   else quarantine_seconds)
        self.index = Index(self.order)
        self.leases = Leases()
        self.stats = EngineStats()
        self.mover = Mover(self.run_transfer)
        #: Keys being copied between tiers (a count: several copies may overlap).
        self._in_flight: Counter[BlockKey] = Counter()
        #: Deleted blocks still being read or copied: key -> tiers whose bytes to free.
        self._deferred_free: dict[BlockKey, set[str]] = {}
        #: (key, dst tier) -> completion of the copy running now
        self._copies: dict[tuple[BlockKey, str], asyncio.Future[None]] = {}
        self._medium = {name: t.medium for name, t in self.tiers.items()}
        #: Tiers whose bytes co-located clients map (and so could overwrite): every
        #: read from them is checked against the block's checksum.
        self._mapped = {name for name, t in self.tiers.items()
                        if isinstance(t.unwrap(), SlotTier)}
        #: Only build per-lookup key lists for policies that prefetch.
        self._wants_lookups = type(policy).on_lookup is not Policy.on_lookup
        #: Hooks for a tier other hosts share (kvstore.engine.shared), set by the server.
        self.shared: SharedPrefix | None = None

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> int:
        """Recover persistent tiers into the index; start the mover. Returns blocks recovered."""
        from kvstore.tiers.base import PersistentTier

        recovered = 0
        now = self.clock()
        # Routers may still hold what a previous run of this sidecar announced: the
        # first batch says everything is gone, then what survived is stored again.
        self.events.all_cleared()
        for name in self.order:
            tier = self.tiers[name]
            inner = tier.unwrap()
            if isinstance(inner, PersistentTier):
                metas, orphans = reachable(await inner.recover())
                for meta in orphans:
                    await tier.delete(meta.key)
                if orphans:
                    self.stats.orphans_dropped += len(orphans)
                    log.warning("tier %s: dropped %d recovered blocks whose parent is gone "
                                "(unreachable by any prefix lookup)", name, len(orphans))
                for meta in metas:
                    self.index.add_location(meta, name)
                    self.policy.on_insert(block_info(meta), name, now)
                if metas:
                    self.events.block_stored(metas, tier.medium)
                recovered += len(metas)
        self.mover.start()
        return recovered

    def startup_skipped(self) -> int:
        """Entries the persistent tiers could not use at start (damaged, foreign)."""
        return sum(int(getattr(self.tiers[n].unwrap(), "startup_skipped", 0))
                   for n in self.order)

    async def close(self, drain_seconds: float = 10.0) -> None:
        """Finish queued transfers (write-backs to disk) for a while, then close tiers."""
        try:
            await asyncio.wait_for(self.mover.drain(), drain_seconds)
        except TimeoutError:
            log.warning("closing with %d transfers still queued", self.mover.pending)
        await self.mover.close()
        for name in reversed(self.order):
            await self.tiers[name].close()

    async def sweep(self) -> None:
        """Expire leases and reservations; free deleted blocks nobody holds any more
        (called periodically by the server)."""
        now = self.clock()
        for key, tier_names in list(self._deferred_free.items()):
            if self.is_protected(key):
                continue
            del self._deferred_free[key]
            entry = self.index.get(key)
            for tier_name in tier_names:
                if entry is None or tier_name not in entry.tiers:
                    await self.tiers[tier_name].delete(key)
        if self.shared is not None:
            self.shared.sweep()
        self.leases.expire_leases(now)
        for r in self.leases.expire_reservations(now, self.quarantine_seconds):
            tier = self.tiers[r.tier].unwrap()
            if isinstance(tier, SlotTier):
                tier.abort(r.slot)

    # -- capacity -----------------------------------------------------------------------
    def protected(self) -> set[Hashable]:
        return set(self.leases.pins) | set(self._in_flight) | self.leases.reserved_keys()

    def free_pending(self, key: BlockKey) -> bool:
        """True while a deleted copy of ``key`` is still being read: storing it again
        now would race the deferred free, so writers skip it this time."""
        return key in self._deferred_free

    def is_protected(self, key: BlockKey) -> bool:
        return key in self.leases.pins or key in self._in_flight

    async def make_room(self, tier_name: str, size: int) -> None:
        """Evict (demoting where the policy says) until ``size`` bytes fit in the tier."""
        tier = self.tiers[tier_name]
        check_size(tier_name, tier.capacity_bytes, size)  # BlockTooLargeForTier
        for _ in range(_MAX_EVICTION_ROUNDS):
            if tier.can_fit(size):
                return
            need = max(size - (tier.capacity_bytes - tier.used_bytes), 1)
            now = self.clock()
            victims = self.policy.evict(tier_name, need, self.protected(), now)
            if not victims:
                break
            for key in victims:
                # Victims were chosen before the awaits below: skip any that became
                # pinned or started moving since.
                if not self.is_protected(key):
                    await self._evict(key, tier_name, now)
        if not tier.can_fit(size):
            raise TierFull(
                f"tier {tier_name!r} is full ({tier.used_bytes}/{tier.capacity_bytes} bytes) "
                f"and nothing evictable frees {size} bytes: the rest is pinned or in flight"
            )

    async def _evict(self, key: BlockKey, tier_name: str, now: float) -> None:
        entry = self.index.get(key)
        if entry is None or tier_name not in entry.tiers:
            self.policy.on_remove(key, tier_name)
            return
        dst = self.policy.demote_to(key, tier_name, now)
        if dst is not None and dst not in entry.tiers:
            try:
                await self.copy(entry, tier_name, dst)
            except Exception as exc:  # a failed demotion degrades to a drop
                self.stats.demotions_failed += 1
                log.debug("demotion of %s to %s failed, dropping: %s", key, dst, exc)
        if key in self._in_flight:
            return  # another copy of it started meanwhile; leave it, evict others
        self.stats.evictions[tier_name] += 1
        await self._drop(key, tier_name)

    # -- placement primitives -------------------------------------------------------------
    async def _store(self, meta: BlockMeta, payload: bytes | memoryview, tier_name: str) -> Entry:
        await self.make_room(tier_name, meta.size)
        tier = self.tiers[tier_name]
        await tier.put(meta, payload)
        return self._stored(meta, tier_name)

    def _stored(self, meta: BlockMeta, tier_name: str) -> Entry:
        entry = self.index.add_location(meta, tier_name)
        self.policy.on_insert(block_info(meta), tier_name, self.clock())
        self.events.block_stored([meta], self.tiers[tier_name].medium)
        return entry

    async def copy(self, entry: Entry, src: str, dst: str) -> None:
        """Copy a block into ``dst`` (no-op if it is there); concurrent copies of one
        block to one tier share a single transfer."""
        key = entry.key
        if dst in entry.tiers:
            return
        running = self._copies.get((key, dst))
        if running is not None:
            await asyncio.shield(running)
            return
        done = asyncio.get_running_loop().create_future()
        self._copies[(key, dst)] = done
        try:
            await self._copy_once(entry, src, dst)
        finally:
            del self._copies[(key, dst)]
            done.set_result(None)

    async def _copy_once(self, entry: Entry, src: str, dst: str) -> None:
        key = entry.key
        self._in_flight[key] += 1
        try:
            payload = await self.tiers[src].get(key)
            await self.make_room(dst, entry.meta.size)
            await self.tiers[dst].put(entry.meta, payload)
            # The source bytes must match their checksum (a mapped tier's may have been
            # overwritten by a client, or changed under the copy): a corrupt source is
            # dropped, never copied on or served.
            if xxhash.xxh3_64_intdigest(payload) != entry.meta.checksum:
                await self.tiers[dst].delete(key)
                await self.drop_corrupt(key, src, f"while being copied to {dst!r}")
                raise DataCorruption(f"{key} is corrupt in {src!r}; dropped")
            if self.index.get(key) is not entry:
                await self.tiers[dst].delete(key)  # deleted while we copied: keep it deleted
                return
            self._stored(entry.meta, dst)
            self.stats.moved_bytes[(src, dst)] += entry.meta.size
        finally:
            self._in_flight[key] -= 1
            if self._in_flight[key] <= 0:
                del self._in_flight[key]

    async def _drop(self, key: BlockKey, tier_name: str) -> None:
        """Forget ``key`` in a tier and free its bytes, unless a reader or a copy still
        holds them: then they are freed once let go (:meth:`sweep`), so a slot is never
        reused under a lease."""
        self.index.remove_location(key, tier_name)
        self.policy.on_remove(key, tier_name)
        self.events.block_removed([key], self.tiers[tier_name].medium)
        if self.is_protected(key):
            self._deferred_free.setdefault(key, set()).add(tier_name)
        else:
            await self.tiers[tier_name].delete(key)

    async def drop_corrupt(self, key: BlockKey, tier_name: str, where: str) -> None:
        self.stats.corrupt_reads += 1
        log.error("corrupt copy of %s in %s (%s): dropped", key, tier_name, where)
        entry = self.index.get(key)
        if entry is not None and tier_name in entry.tiers:
            await self._drop(key, tier_name)

    async def run_transfer(self, t: Transfer) -> None:
        """Execute one mover transfer, re-checking state (things change while queued)."""
        entry = self.index.get(t.key)
        if entry is None or t.src not in entry.tiers:
            return
        if t.key in self._in_flight:
            return  # already being copied (a demotion or promotion does the same work)
        if not t.keep_src and t.key in self.leases.pins:
            return  # being read: a move away would pull it from under the reader
        if t.dst is not None and t.dst not in entry.tiers:
            await self.copy(entry, t.src, t.dst)
        if not t.keep_src and self.index.get(t.key) is not None:
            await self._drop(t.key, t.src)

    def _schedule(self, moves: Sequence[Move], reason: str) -> int:
        """Queue the policy's moves. A drop (``dst=None``) drops every copy: with
        write-back a block may sit in several tiers, and the policy sees the fastest.
        A move up (a prefetch) keeps the slower copy, as write-back would make it."""
        n = 0
        rank = self._rank
        for m in moves:
            if not isinstance(m.key, BlockKey):
                continue
            entry = self.index.get(m.key)
            srcs = list(entry.tiers) if (m.dst is None and entry is not None) else [m.src]
            for src in srcs:
                up = m.dst is not None and rank.get(m.dst, len(rank)) < rank.get(src, -1)
                n += self.mover.submit(Transfer(m.key, src, m.dst, keep_src=up, reason=reason))
        return n

    def written_in_place(self, meta: BlockMeta, tier_name: str) -> Entry:
        """Record a block whose bytes a client already wrote into ``tier_name`` (a
        shared-memory slot): index it, tell the policy and the event stream, and queue
        its write-back, as :meth:`put` does for the bytes it stores itself."""
        entry = self._stored(meta, tier_name)
        self._after_store(entry)
        return entry

    def _after_store(self, entry: Entry) -> None:
        if self.shared is not None:
            self.shared.after_store(entry)
        if self.write_back:
            i = self._rank[entry.tiers[0]] + 1
            if i < len(self.order):
                self.mover.submit(Transfer(entry.key, entry.tiers[0], self.order[i],
                                           keep_src=True, reason="write-back"))

    # -- the operations -----------------------------------------------------------------
    async def put(self, namespace: str, blocks: Sequence[NewBlock], session_id: str = "",
                  workload: str = "") -> tuple[int, int]:
        """Store blocks (gRPC path). Returns (stored, already present)."""
        wl = Workload.parse(workload)
        self.check_blocks(namespace, blocks)
        stored = existing = 0
        placed: list[Entry] = []
        for b in blocks:
            if self.index.get_hash(namespace, b.block_hash) is not None:
                existing += 1
                continue
            if self.free_pending(BlockKey(namespace, b.block_hash)):
                continue  # its deleted copy is still being read; store it next time
            meta = new_meta(namespace, b, xxhash.xxh3_64_intdigest(b.payload), session_id, wl)
            target = self.policy.admit(block_info(meta), self.clock())
            if target is None:
                continue
            try:
                entry = await self._store(meta, b.payload, target)
            except Unavailable as exc:  # e.g. the shared tier is down: not stored, no error
                log.warning("block %s not stored in %s: %s", meta.key, target, exc)
                continue
            self._after_store(entry)
            placed.append(entry)
            stored += 1
            self.stats.bytes_in += meta.size
        self.touch_tail_first(placed)
        self.stats.puts += 1
        return stored, existing

    def check_blocks(self, namespace: str, blocks: Sequence[NewBlock]) -> None:
        """Hashes, parents, payload sizes and token counts of blocks to store."""
        self.check_hashes(namespace, [b.block_hash for b in blocks])
        check_blocks(self.index, namespace, blocks, self.max_block_bytes)
        for b in blocks:
            if len(b.token_ids) > self.max_block_tokens:
                raise InvalidArgument(
                    f"block {bytes(b.block_hash).hex()[:16]} carries {len(b.token_ids)} token "
                    f"ids; a block may carry at most {self.max_block_tokens} "
                    "(server.max_block_tokens)")

    def touch_tail_first(self, entries: Sequence[Entry]) -> None:
        """Touch a chain's blocks last to first, as vLLM frees them: under pressure
        a chain then loses its tail before its head."""
        now = self.clock()
        for entry in reversed(entries):
            if entry.tiers:
                self.policy.on_access(entry.key, entry.tiers[0], now)

    def lookup(self, namespace: str, hashes: Sequence[bytes], session_id: str = "",
               workload: str = "") -> list[Medium]:
        """Media of the longest stored prefix of ``hashes`` (fastest tier each).

        The hot path of every scheduling step: one dict probe and one policy
        touch per block, nothing else."""
        hashes = self.check_hashes(namespace, hashes)
        now = self.clock()
        blocks = self.index.blocks_of(namespace)
        touch = self.policy.on_access
        hit_tiers: list[str | None] = []
        hit: list[Entry] = []
        for h in hashes:
            entry = blocks.get(h)
            if entry is None:
                break
            hit.append(entry)
            hit_tiers.append(entry.tiers[0])
        top = self.order[0]
        for entry in reversed(hit):  # tail first: the head ends most recent (vLLM's order)
            touch(entry.meta.key, entry.tiers[0], now)
            if entry.tiers[0] != top:
                # The session is back: bring its prefix up before the engine reads it.
                self.mover.submit(Transfer(entry.meta.key, entry.tiers[0], top, keep_src=True,
                                           reason="prefetch"))
        st = self.stats
        st.tier_hits.update(hit_tiers)  # type: ignore[arg-type]
        st.lookups += 1
        st.lookup_hit_blocks += len(hit_tiers)
        st.lookup_miss_blocks += len(hashes) - len(hit_tiers)
        medium = self._medium
        media = [medium[t] for t in hit_tiers]  # type: ignore[index]
        if hashes and self._wants_lookups:
            keys = [BlockKey(namespace, h) for h in hashes]
            info = BlockInfo(key=keys[0], size=0, session_id=session_id,
                             workload=workload or "unknown", request_blocks=len(hashes))
            hit_tiers += [None] * (len(hashes) - len(hit_tiers))
            self._schedule(self.policy.on_lookup(keys, hit_tiers, info, now), "prefetch")
        return media

    async def get(self, namespace: str, hashes: Sequence[bytes]
                  ) -> list[tuple[BlockMeta, bytes] | None]:
        """Verified payload copies of the blocks (None where missing), in order."""
        out: list[tuple[BlockMeta, bytes] | None] = [None] * len(hashes)
        async for i, meta, payload in self.iter_get(namespace, hashes):
            out[i] = (meta, payload)
        return out

    async def iter_get(self, namespace: str, hashes: Sequence[bytes]
                       ) -> AsyncIterator[tuple[int, BlockMeta, bytes]]:
        """(index, meta, verified payload) of each stored block, one at a time (a Get
        streams without holding the whole answer in memory)."""
        hashes = self.check_hashes(namespace, hashes, unique=True)
        self.index.require_namespace(namespace)
        self.stats.gets += 1
        for i, h in enumerate(hashes):
            entry = self.index.get_hash(namespace, h)
            if entry is None:
                continue
            payload = await self._read(entry)
            if payload is None:
                continue
            if entry.tiers:
                self.policy.on_access(entry.key, entry.tiers[0], self.clock())
            self.stats.bytes_out += len(payload)
            yield i, entry.meta, payload

    def check_hashes(self, namespace: str, hashes: Sequence[bytes], *, unique: bool = False
                     ) -> list[bytes]:
        """Validate one call's hashes: lengths, at most ``max_hashes``, and (for reads
        that return payloads) no hash twice."""
        if len(hashes) > self.max_hashes:
            raise InvalidArgument(
                f"a call may carry at most {self.max_hashes} block hashes, got {len(hashes)} "
                "(server.max_hashes_per_call); split it")
        out = hashes if isinstance(hashes, list) else list(hashes)
        self.index.check_hashes(namespace, out)
        if unique and len(set(out)) != len(out):
            raise InvalidArgument("duplicate block hashes in one call: ask for each block once")
        return out

    async def _read(self, entry: Entry) -> bytes | None:
        """A verified copy of the block's bytes from its fastest intact tier."""
        for tier_name in list(entry.tiers):
            try:
                payload = bytes(await self.tiers[tier_name].get(entry.key))
            except DataCorruption as exc:
                await self.drop_corrupt(entry.key, tier_name, str(exc))
                continue
            except BlockNotFound:
                await self._drop(entry.key, tier_name)
                continue
            if (tier_name in self._mapped
                    and xxhash.xxh3_64_intdigest(payload) != entry.meta.checksum):
                await self.drop_corrupt(entry.key, tier_name, "checksum mismatch on read")
                continue
            return payload
        return None

    async def delete(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """Delete blocks from every tier; no hashes = the whole namespace."""
        if not hashes:
            self.index.require_namespace(namespace)
            entries = list(self.index.entries(namespace))
        else:
            hashes = self.check_hashes(namespace, hashes)
            entries = [e for h in dict.fromkeys(hashes) if (e := self.index.get_hash(namespace, h))]
        # Forget every copy before the first await, so a copy finishing meanwhile sees
        # its block gone (and discards itself) instead of re-adding it.
        to_free: list[tuple[BlockKey, str]] = []
        for entry in entries:
            for tier_name in list(entry.tiers):
                self.index.remove_location(entry.key, tier_name)
                self.policy.on_remove(entry.key, tier_name)
                self.events.block_removed([entry.key], self.tiers[tier_name].medium)
                if self.is_protected(entry.key):
                    # Being read or copied: free the bytes once it is let go (sweep).
                    self._deferred_free.setdefault(entry.key, set()).add(tier_name)
                else:
                    to_free.append((entry.key, tier_name))
        for key, tier_name in to_free:
            await self.tiers[tier_name].delete(key)
        if not hashes and entries:
            self.events.all_cleared()
        return len(entries)

    def hint(self, hint: Hint) -> int:
        """A turn / session event: let the policy move that session's blocks."""
        now = self.clock()
        keys = [(e.key, e.tiers[0]) for e in self.index.session_entries(hint.session_id)]
        return self._schedule(self.policy.on_hint(hint, keys, now), f"hint:{hint.event}")
