"""The engine: one owner for every block's lifecycle.

It keeps the index (which block is in which tier), passes each request to the
policy once and keeps its admission plan until the blocks arrive, scopes
sessions by namespace, enforces capacity by asking the policy for victims, pins
blocks that are being read or moved, runs read leases and the two-phase store
of the shared-memory plane, queues transfers on the mover, and emits a
placement event for every change. Tiers only store bytes; policies only decide.

The engine is made of parts it holds, each in its own module: the placement
(:mod:`~kvstore.engine.placement`: tiers, index, room, copies, drops), the
durability (:mod:`~kvstore.engine.writeback`: recovery point, drain), the planner
(:mod:`~kvstore.engine.planning`: admission plans per request), the store pipeline
(:mod:`~kvstore.engine.store`: the one store operation behind Put and
Reserve/Commit) and the lookups (:mod:`~kvstore.engine.lookup`). A tier other
hosts share is reached through :class:`~kvstore.engine.observe.SharedHooks`, the
live profile through :class:`~kvstore.engine.observe.TrafficObserver`, read holds
through :class:`~kvstore.engine.observe.Holder`.

The same engine serves traffic and replays traces (:mod:`kvstore.replay`): the
replay gives it in-memory tiers sized in blocks, a virtual clock, and runs the
mover's queue itself between requests.

Why a little past ~400 lines: this is the engine's whole public surface (lifecycle,
validation, and the domain call behind every RPC), each method a few lines handing
over to one of the parts above; splitting it would split one API in two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from dataclasses import replace

from kvstore.engine.blocks import NewBlock, block_info, check_blocks
from kvstore.engine.durability import RecoveryPoint, WriteHealth
from kvstore.engine.eviction import EvictionManager
from kvstore.engine.geometry import Geometry
from kvstore.engine.index import Index, reachable
from kvstore.engine.leases import Leases
from kvstore.engine.lookup import Lookup, Lookups, check_turn
from kvstore.engine.mover import Mover
from kvstore.engine.observe import Holder, SharedHooks, TrafficObserver
from kvstore.engine.placement import Placement
from kvstore.engine.planning import Planner, check_hint
from kvstore.engine.quotas import Quota, Quotas
from kvstore.engine.requests import Requests
from kvstore.engine.retention import Retention, RetentionLimits
from kvstore.engine.sessions import Sessions
from kvstore.engine.stats import EngineStats
from kvstore.engine.store import StorePipeline
from kvstore.engine.writeback import WriteBack
from kvstore.errors import InvalidArgument
from kvstore.events import EventSink, NullSink
from kvstore.policies import Hint, Policy, TierSpec
from kvstore.policies.cost import CostModel, read_bytes_per_s
from kvstore.tiers.base import SlotTier, Tier
from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["Engine", "Lookup", "NewBlock"]  # NewBlock re-exported from kvstore.engine.blocks

#: A Delete of many blocks lets the event loop run other calls after each this many.
_DELETE_CHUNK = 256

log = logging.getLogger(__name__)


def tier_specs(tiers: Sequence[Tier], bandwidth: Mapping[str, float] | None = None
               ) -> list[TierSpec]:
    """The policy's view of ``tiers``: bandwidths from the shared cost table, or from
    ``bandwidth`` (configured per tier)."""
    bw = bandwidth or {}
    return [TierSpec(t.name, t.capacity_bytes, bw.get(t.name) or read_bytes_per_s(t.name))
            for t in tiers]


class Engine:
    def __init__(
        self,
        tiers: Sequence[Tier],
        policy: Policy | EvictionManager,
        events: EventSink | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        cost: CostModel | None = None,
        lease_seconds: float = 30.0,
        max_block_bytes: int = 64 * 2**20,
        write_back: bool = True,
        max_hashes: int = 131_072,
        max_block_tokens: int = 8192,
        max_lease_seconds: float = 300.0,
        max_pinned_fraction: float = 0.75,
        quarantine_seconds: float | None = None,
        request_ttl_s: float = 600.0,
        session_ttl_s: float = 7200.0,
        bandwidth: Mapping[str, float] | None = None,
        quotas: Sequence[Quota] = (),
        max_write_delay_s: float | None = None,
        retention: RetentionLimits | None = None,
    ) -> None:
        pl = self.placement = Placement(tiers, policy, events or NullSink(), clock, write_back,
                                        quotas, retention)
        self.geometry = Geometry(cost or CostModel(), tier_specs(tiers, bandwidth))
        self.durability = WriteBack(pl, self.geometry)
        #: The recovery point: with a persistent tier, every new block in a faster one
        #: is queued for write-back there this long after its put (at the first sweep
        #: after), whatever the policy's own write-back decided; None: no such bound.
        if max_write_delay_s is not None and self.durability.durable_tier() is not None:
            pl.recovery = RecoveryPoint(max_write_delay_s)
        self.lease_seconds = lease_seconds
        self.max_block_bytes = max_block_bytes
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
        self.requests = Requests(ttl_s=request_ttl_s)
        self.sessions = Sessions(ttl_s=session_ttl_s)
        self.planner = Planner(pl, self.requests, self.sessions, self.geometry)
        self.store = StorePipeline(pl, self.durability, self.planner)
        self.lookups = Lookups(pl, self.planner)
        #: Sees every first lookup, store and hint (the server's live profile).
        self.profile: TrafficObserver | None = None
        #: Pins blocks for co-located readers (the shared-memory plane attaches itself).
        self.plane: Holder | None = None
        # The placement's parts others read, held here too (the same objects).
        self.tiers: dict[str, Tier] = pl.tiers
        self.order: list[str] = pl.order
        self.policy: EvictionManager = pl.policy
        self.events: EventSink = pl.events
        self.clock: Callable[[], float] = pl.clock
        self.index: Index = pl.index
        self.stats: EngineStats = pl.stats
        self.mover: Mover = pl.mover
        self.leases: Leases = pl.leases
        self.retention: Retention = pl.retention
        self.quotas: Quotas = pl.quotas
        self.health: WriteHealth = pl.health

    @property
    def recovery(self) -> RecoveryPoint | None:
        return self.placement.recovery

    @property
    def shared(self) -> SharedHooks | None:
        """The hooks of a tier other hosts share (the server attaches them)."""
        return self.placement.shared

    @shared.setter
    def shared(self, hooks: SharedHooks | None) -> None:
        self.placement.shared = hooks

    @property
    def accepting(self) -> bool:
        """False once a drain began: puts are refused (UNAVAILABLE)."""
        return self.durability.accepting

    async def drain(self, seconds: float) -> int:
        """Stop taking puts and write DRAM back to disk (see :meth:`WriteBack.drain`)."""
        return await self.durability.drain(seconds)

    async def free_deferred(self) -> None:
        """Free dropped copies nobody holds any more (the sweeper calls this)."""
        await self.placement.free_deferred()

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> int:
        """Recover persistent tiers into the index; start the mover. Returns blocks recovered."""
        from kvstore.tiers.base import PersistentTier

        pl = self.placement
        recovered = 0
        now = pl.clock()
        # Routers may still hold what a previous run of this sidecar announced: the
        # first batch says everything is gone, then what survived is stored again.
        pl.events.all_cleared()
        for name in pl.order:
            tier = pl.tiers[name]
            inner = tier.unwrap()
            if isinstance(inner, PersistentTier):
                metas, orphans = reachable(await inner.recover())
                for meta in orphans:
                    await tier.delete(meta.key)
                if orphans:
                    pl.stats.orphans_dropped += len(orphans)
                    log.warning("tier %s: dropped %d recovered blocks whose parent is gone "
                                "(unreachable by any prefix lookup)", name, len(orphans))
                for meta in metas:
                    pl.index.add_location(meta, name)
                    pl.policy.on_insert(block_info(meta), name, now)
                if metas:
                    pl.events.block_stored(metas, tier.medium)
                recovered += len(metas)
        pl.mover.start()
        return recovered

    def startup_skipped(self) -> int:
        """Entries the persistent tiers could not use at start (damaged, foreign)."""
        return sum(int(getattr(self.tiers[n].unwrap(), "startup_skipped", 0))
                   for n in self.order)

    async def close(self, drain_seconds: float = 10.0) -> None:
        """Finish queued transfers (write-backs to disk) for a while, then close tiers."""
        import asyncio

        try:
            await asyncio.wait_for(self.mover.drain(), drain_seconds)
        except TimeoutError:
            log.warning("closing with %d transfers still queued", self.mover.pending)
        await self.mover.close()
        for name in reversed(self.order):
            await self.tiers[name].close()

    async def sweep(self) -> None:
        """Expire leases and reservations; free dropped copies nobody holds any more
        (called periodically by the server)."""
        pl = self.placement
        now = pl.clock()
        await pl.free_deferred()
        if pl.shared is not None:
            pl.shared.sweep()
        pl.leases.expire_leases(now)
        for r in pl.leases.expire_reservations(now, self.quarantine_seconds):
            tier = pl.tiers[r.tier].unwrap()
            if isinstance(tier, SlotTier):
                tier.abort(r.slot)
        self.sessions.expire(now)
        pl.retention.expire(now)
        self.durability.queue_recovery_point()

    def set_geometry(self, namespace: str, block_bytes: int, block_tokens: int,
                     stored_bytes: int | None = None) -> None:
        """Fix a namespace's block size for the cost model, and the bytes its blocks
        occupy in the tiers if they differ (the replay stores stand-ins); the server
        measures both from what is stored."""
        self.geometry.set(namespace, block_bytes, block_tokens, stored_bytes)

    # -- validation -------------------------------------------------------------------
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

    # -- the operations -----------------------------------------------------------------
    def lookup(self, namespace: str, hashes: Sequence[bytes], session_id: str = "",
               workload: str = "", *, request_id: Hashable = "", num_tokens: int = 0
               ) -> list[Medium]:
        """Media of the longest stored prefix of ``hashes`` worth loading (see
        :meth:`lookup_request`)."""
        return self.lookup_request(namespace, hashes, session_id, workload,
                                   request_id=request_id, num_tokens=num_tokens).media

    def lookup_request(self, namespace: str, hashes: Sequence[bytes], session_id: str = "",
                       workload: str = "", *, request_id: Hashable = "", num_tokens: int = 0,
                       then: str = "", tool: str = "", expected_gap_s: float | None = None,
                       engine_hit_tokens: int | None = None) -> Lookup:
        """The longest locally stored prefix of ``hashes`` worth loading, with the
        fastest tier of each block: it stops at the first block missing or held only in
        a tier that loses to recomputing it (cost model). And how many blocks after it
        the request should offer to store (the policy admits them, or holds them
        already). :meth:`serve_lookup` adds the shared tier, the profile and a hold.

        The first lookup of a request goes to the policy (its plan says where the
        missing blocks may be stored; its moves run on the mover) and prefetches the
        served blocks into the fastest tier; a repeat of the same ``request_id`` only
        reads the index (a request is its namespace's: the same id in another
        namespace is another request). ``num_tokens``: the request's prompt length, if
        known (its last block may be partial). ``then`` / ``tool`` / ``expected_gap_s``:
        what the client says the request's turn ends with (for the policy's HBM keep);
        ``engine_hit_tokens``: the prompt tokens the serving engine's own prefix cache
        holds (vLLM's ``num_computed_tokens``; None: unknown)."""
        found = self._lookup(namespace, hashes, session_id, workload, request_id, num_tokens,
                             then, tool, expected_gap_s, engine_hit_tokens)
        self.placement.policy.settle()
        return found

    def _lookup(self, namespace: str, hashes: Sequence[bytes], session_id: str,
                workload: str, request_id: Hashable, num_tokens: int, then: str, tool: str,
                expected_gap_s: float | None, engine_hit_tokens: int | None) -> Lookup:
        """:meth:`lookup_request` with its hits' recency bookkeeping left to the policy's
        next call or ``settle`` (see ``EvictionManager.on_access_many_later``)."""
        check_turn(then, expected_gap_s)
        hashes = self.check_hashes(namespace, hashes)
        return self.lookups.find(namespace, hashes, session_id, workload, request_id,
                                 num_tokens, then, tool, expected_gap_s, engine_hit_tokens)

    def use_mover(self, mover: Mover) -> None:
        """Run transfers on ``mover`` (built on ``placement.run_transfer``) instead of the
        engine's own: the replay's mover on its virtual clock. Before :meth:`start`."""
        self.placement.mover = self.mover = mover

    async def serve_lookup(self, namespace: str, hashes: Sequence[bytes], session_id: str = "",
                           workload: str = "", *, request_id: Hashable = "",
                           num_tokens: int = 0, then: str = "", tool: str = "",
                           expected_gap_s: float | None = None, hold: bool = False,
                           lease_seconds: float = 0.0, owner: str = "",
                           engine_hit_tokens: int | None = None) -> Lookup:
        """A lookup as the server answers it: :meth:`lookup_request`, continued from a
        tier other hosts share (its store count corrected by what that found), seen by
        the profile (a request's first lookup only), and with ``hold`` the served
        prefix pinned for ``owner`` to read from shared memory (``Lookup.held``)."""
        hashes = list(hashes)
        found = self._lookup(namespace, hashes, session_id, workload, request_id, num_tokens,
                             then, tool, expected_gap_s, engine_hit_tokens)
        # The answer goes first: the hits' recency and the live profile's look at the
        # request are told once the loop is free (before the policy's next call in any
        # case), off the Lookup's latency on the engine's scheduler step. Two turns on,
        # not one: what was ready when the Lookup ended (another caller's turn, a
        # finished read) runs first, not after ~0.3 ms of bookkeeping (loop lag under a
        # save storm, docs/benchmarks/dataplane.md).
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_soon, self._after_lookup, namespace, hashes, session_id,
                       workload, found.repeat)
        found = await self.lookups.extend(namespace, hashes, found)
        if hold and found.media and self.plane is not None:
            held = await self.plane.acquire(namespace, hashes[:len(found.media)],
                                            lease_seconds, owner)
            found = replace(found, held=held)
        return found

    def _after_lookup(self, namespace: str, hashes: list[bytes], session_id: str,
                      workload: str, repeat: bool) -> None:
        self.placement.policy.settle()
        if not repeat and self.profile is not None:
            self.profile.on_lookup(namespace, hashes, session_id, workload)

    async def put(self, namespace: str, blocks: Sequence[NewBlock], session_id: str = "",
                  workload: str = "", *, request_id: Hashable = "", spill: bool = True
                  ) -> tuple[int, int]:
        """Store blocks (gRPC path) where their request's plan says. Returns (stored,
        already present). When a tier cannot make room for a block (what is left is
        pinned, in flight, or the request's own blocks), the blocks before it stay
        stored and the rest are skipped; if none could be stored, TierFull.

        ``spill`` (the default): such a block first tries the rest of its chain in the
        next tier down. ``spill=False`` runs the connector's Reserve/Commit semantics
        on any tiers: a block stays in its planned tier or the chain stops there (a
        tenant at its quota stops it without an error). See :mod:`kvstore.engine.store`."""
        self.durability.check_accepting()
        self.check_blocks(namespace, blocks)
        out = await self.store.put(namespace, blocks, session_id, workload, request_id,
                                   spill=spill)
        if self.profile is not None:
            self.profile.on_store((len(b.payload), len(b.token_ids)) for b in blocks)
        return out

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
        pl = self.placement
        pl.index.require_namespace(namespace)
        pl.stats.gets += 1
        for i, h in enumerate(hashes):
            entry = pl.index.get_hash(namespace, h)
            if entry is None:
                continue
            payload = await pl.read(entry)
            if payload is None:
                continue
            if entry.tiers:
                pl.policy.on_access(entry.key, entry.tiers[0], pl.clock())
            pl.stats.bytes_out += len(payload)
            yield i, entry.meta, payload

    async def delete(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """Delete blocks from every tier; no hashes = the whole namespace."""
        pl = self.placement
        if not hashes:
            pl.index.require_namespace(namespace)
            entries = list(pl.index.entries(namespace))
        else:
            hashes = self.check_hashes(namespace, hashes)
            entries = [e for h in dict.fromkeys(hashes) if (e := pl.index.get_hash(namespace, h))]
        # _DELETE_CHUNK blocks at a time, the loop let go in between (a namespace of
        # thousands held it ~100 ms). In a chunk, every copy is forgotten before the
        # first await, so a copy finishing meanwhile sees its block gone (and discards
        # itself) instead of re-adding it. A block of a later chunk removed meanwhile
        # has no tiers left to forget.
        for start in range(0, len(entries), _DELETE_CHUNK):
            if start:
                await asyncio.sleep(0)
            to_free: list[tuple[BlockKey, str]] = []
            for entry in entries[start:start + _DELETE_CHUNK]:
                if start and pl.index.get(entry.key) is not entry:
                    continue  # removed meanwhile (maybe stored anew: not this delete's)
                self.requests.forget(entry.key)
                pl.retention.forget(entry.key)
                for tier_name in list(entry.tiers):
                    if pl.unlink(entry.key, tier_name):
                        to_free.append((entry.key, tier_name))
            for key, tier_name in to_free:
                await pl.tiers[tier_name].delete(key)
        return len(entries)

    def hint(self, hint: Hint, namespace: str = "", request_id: Hashable = "", *,
             output_tokens: int = 0) -> int:
        """A turn or session event: let the policy move that session's blocks.

        The session is the one of ``request_id`` in ``namespace`` (a request looked
        up before; its hint also ends it), else ``hint.session_id`` in ``namespace``. A
        session's end drops a block only if no other live session still needs it.
        ``output_tokens``: what the turn generated (for the profile)."""
        hint = check_hint(hint, namespace, request_id)
        if self.profile is not None:
            self.profile.on_hint(str(hint.session_id), hint.event, hint.tool or "",
                                 output_tokens)
        return self.planner.hint(hint, namespace, request_id)

    def retain(self, namespace: str, hashes: Sequence[bytes], ttl_s: float) -> int:
        """Keep the blocks for ``ttl_s`` seconds, softly (:mod:`kvstore.engine.retention`);
        ``ttl_s`` 0 ends their retention. Blocks not stored yet are protected when they
        are. Returns how many of them it protects now. The policy is told the deadline
        as the client's statement of their next use."""
        hashes = self.check_hashes(namespace, hashes)
        keys = [BlockKey(namespace, h) for h in dict.fromkeys(hashes)]
        now = self.clock()
        protected = self.retention.retain(keys, self.index, ttl_s, now)
        if ttl_s > 0:
            self.policy.on_retain(keys, now + ttl_s, now)
        return protected
