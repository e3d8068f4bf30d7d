"""The engine: one owner for every block's lifecycle.

It keeps the index (which block is in which tier), passes each request to the
policy once and keeps its admission plan until the blocks arrive, scopes
sessions by namespace, enforces capacity by asking the policy for victims, pins
blocks that are being read or moved, runs read leases and the two-phase store
of the shared-memory plane, queues transfers on the mover, and emits a
placement event for every change. Tiers only store bytes; policies only decide.

The same engine serves traffic and replays traces (:mod:`kvstore.replay`): the
replay gives it in-memory tiers sized in blocks, a virtual clock, and runs the
mover's queue itself between requests.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

import xxhash

from kvstore.engine.blocks import NewBlock, block_info, check_blocks, new_meta
from kvstore.engine.durability import RecoveryPoint
from kvstore.engine.eviction import EvictionManager
from kvstore.engine.geometry import Geometry
from kvstore.engine.index import Entry, reachable
from kvstore.engine.mover import Transfer
from kvstore.engine.quotas import Quota
from kvstore.engine.requests import UNPLANNED, OpenRequest, Requests
from kvstore.engine.retention import RetentionLimits
from kvstore.engine.sessions import Sessions
from kvstore.engine.writeback import WriteBack
from kvstore.errors import InvalidArgument, TierFull, Unavailable
from kvstore.events import EventSink, NullSink
from kvstore.policies import Hint, Policy, RequestInfo, TierSpec
from kvstore.policies.cost import CostModel, read_bytes_per_s
from kvstore.tiers.base import SlotTier, Tier
from kvstore.types import BlockKey, BlockMeta, Medium, SessionKey, Workload

__all__ = ["Engine", "Lookup", "NewBlock"]  # NewBlock re-exported from kvstore.engine.blocks

log = logging.getLogger(__name__)
#: Longest tool name a lookup passes on to the policy (client strings).
_MAX_TOOL_NAME = 128


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a lookup answers: the served prefix's media, and how many blocks after it
    the request should offer to store (each admitted by the policy, or held already);
    blocks past that would be refused, so a client need not copy them."""

    media: list[Medium]
    store: int
    #: HBM keep the policy decided for the request (see ``Plan.keep_s``).
    keep_s: float = 0.0


def tier_specs(tiers: Sequence[Tier], bandwidth: Mapping[str, float] | None = None
               ) -> list[TierSpec]:
    """The policy's view of ``tiers``: bandwidths from the shared cost table, or from
    ``bandwidth`` (configured per tier)."""
    bw = bandwidth or {}
    return [TierSpec(t.name, t.capacity_bytes, bw.get(t.name) or read_bytes_per_s(t.name))
            for t in tiers]


class Engine(WriteBack):
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
        super().__init__(tiers, policy, events or NullSink(), clock, write_back, quotas,
                         retention)
        #: The recovery point: with a persistent tier, every new block in a faster one
        #: is queued for write-back there this long after its put (at the first sweep
        #: after), whatever the policy's own write-back decided; None: no such bound.
        if max_write_delay_s is not None and self.durable_tier() is not None:
            self.recovery = RecoveryPoint(max_write_delay_s)
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
        self.geometry = Geometry(cost or CostModel(), tier_specs(tiers, bandwidth))
        self.requests = Requests(ttl_s=request_ttl_s)
        self.sessions = Sessions(ttl_s=session_ttl_s)

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
        now = self.clock()
        await self.free_deferred()
        if self.shared is not None:
            self.shared.sweep()
        self.leases.expire_leases(now)
        for r in self.leases.expire_reservations(now, self.quarantine_seconds):
            tier = self.tiers[r.tier].unwrap()
            if isinstance(tier, SlotTier):
                tier.abort(r.slot)
        self.sessions.expire(now)
        self.retention.expire(now)
        self.queue_recovery_point()

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

    # -- requests and sessions --------------------------------------------------------------
    def _session(self, namespace: str, session_id: str, hashes: Sequence[bytes]
                 ) -> SessionKey:
        return SessionKey(namespace, session_id or self.sessions.infer(namespace, hashes))

    def _request_info(self, namespace: str, keys: list[BlockKey],
                      hit_tiers: list[str | None], session: SessionKey, workload: str,
                      num_tokens: int, block_bytes: int = 0) -> RequestInfo:
        geo = self.geometry
        tokens = geo.of(namespace)[1]
        last = tokens
        if num_tokens > 0 and keys and geo.known(namespace):
            # Only with the namespace's real block size (the default one would call a
            # full last block of a first request partial, and the policy skip it).
            last = max(1, min(tokens, num_tokens - (len(keys) - 1) * tokens))
        return RequestInfo(keys, hit_tiers, session, workload,
                           block_bytes or geo.stored_bytes(namespace), tokens, last,
                           geo.worth(namespace))

    def lookup(self, namespace: str, hashes: Sequence[bytes], session_id: str = "",
               workload: str = "", *, request_id: Hashable = "", num_tokens: int = 0
               ) -> list[Medium]:
        """Media of the longest stored prefix of ``hashes`` worth loading (see
        :meth:`lookup_request`)."""
        return self.lookup_request(namespace, hashes, session_id, workload,
                                   request_id=request_id, num_tokens=num_tokens).media

    def lookup_request(self, namespace: str, hashes: Sequence[bytes], session_id: str = "",
                       workload: str = "", *, request_id: Hashable = "", num_tokens: int = 0,
                       then: str = "", tool: str = "", expected_gap_s: float | None = None
                       ) -> Lookup:
        """The longest stored prefix of ``hashes`` worth loading, with the fastest tier of
        each block: it stops at the first block missing or held only in a tier that
        loses to recomputing it (cost model). And how many blocks after it the request
        should offer to store (the policy admits them, or holds them already).

        The first lookup of a request goes to the policy (its plan says where the
        missing blocks may be stored; its moves run on the mover) and prefetches the
        served blocks into the fastest tier; a repeat of the same ``request_id`` only
        reads the index (a request is its namespace's: the same id in another
        namespace is another request). ``num_tokens``: the request's prompt length, if known (its
        last block may be partial). ``then`` / ``tool`` / ``expected_gap_s``: what the
        client says the request's turn ends with (for the policy's HBM keep)."""
        if then and then not in Hint.EVENTS:
            raise InvalidArgument(
                f"then: unknown hint event {then!r}; valid: {', '.join(sorted(Hint.EVENTS))}")
        if expected_gap_s is not None and not 0 <= expected_gap_s < 1e9:
            raise InvalidArgument(f"expected_gap_ms: must be >= 0, got {expected_gap_s * 1e3!r}")
        hashes = self.check_hashes(namespace, hashes)
        wl = Workload.parse(workload).value
        blocks = self.index.blocks_of(namespace)
        hit: list[Entry] = []
        for h in hashes:
            entry = blocks.get(h)
            if entry is None:
                break
            hit.append(entry)
        worth = self.geometry.worth(namespace)
        rank = self._rank
        served = 0
        for entry in hit:
            if not worth[rank[entry.tiers[0]]]:
                break
            served += 1
        medium = self._medium
        media = [medium[e.tiers[0]] for e in hit[:served]]
        now = self.clock()
        opened = self.requests.get(namespace, request_id)
        if opened is not None:  # a repeat: counted once
            return Lookup(media, self._store_count(namespace, hashes, served, now),
                          opened.keep_s)
        session = self._session(namespace, session_id, hashes)
        keys = [BlockKey(namespace, h) for h in hashes]
        hit_tiers: list[str | None] = [e.tiers[0] for e in hit]
        hit_tiers += [None] * (len(keys) - len(hit))
        req = replace(self._request_info(namespace, keys, hit_tiers, session, wl, num_tokens),
                      then=then, tool=tool[:_MAX_TOOL_NAME], expected_gap_s=expected_gap_s)
        plan = self.policy.on_request(req, now)
        keep_s = max(0.0, plan.keep_s)
        self.requests.plan(keys, plan.admit, [t is None for t in hit_tiers], now)
        self.requests.open(request_id, OpenRequest(namespace, keys, session, wl, now, keep_s))
        self.sessions.used(session, keys, now)
        touch = self.policy.on_access
        for i in range(len(hit) - 1, -1, -1):  # tail first: the head ends most recent
            entry = hit[i]
            touch(entry.key, entry.tiers[0], now)
        top = self.order[0]
        submit = self.mover.submit
        mine = frozenset(keys)
        for entry in hit[:served]:  # head first: a parent is announced before its child
            if entry.tiers[0] != top:
                # The session is back: bring its prefix up before the engine reads it
                # (without evicting the rest of it to make the room).
                submit(Transfer(entry.key, entry.tiers[0], top, keep_src=True,
                                reason="prefetch", protect=mine))
        if plan.moves:
            self._schedule(plan.moves, "plan")
        st = self.stats
        st.tier_hits.update(e.tiers[0] for e in hit[:served])
        if self.retention:
            for e in hit[:served]:
                self.retention.on_hit(e.key, now)
        st.lookups += 1
        st.lookup_hit_blocks += served
        st.lookup_miss_blocks += len(hashes) - served
        admit = plan.admit
        store = 0
        for i in range(served, len(keys)):
            if hit_tiers[i] is None and keys[i] not in admit:
                break
            store += 1
        return Lookup(media, store, keep_s)

    def _store_count(self, namespace: str, hashes: Sequence[bytes], served: int,
                     now: float) -> int:
        """Blocks after the served prefix a repeated lookup should offer to store."""
        blocks = self.index.blocks_of(namespace)
        planned = self.requests.planned
        n = 0
        for h in hashes[served:]:
            if h not in blocks and planned(BlockKey(namespace, h), now) is None:
                break
            n += 1
        return n

    def plan_admissions(self, namespace: str, hashes: Sequence[bytes], last_tokens: int,
                        session_id: str, workload: str, request_id: Hashable, now: float,
                        block_bytes: int = 0) -> list[str | None]:
        """The tier each new block may enter (None: refused), from its request's plan;
        blocks no plan covers (stored without a lookup) get a request of their own."""
        requests = self.requests
        out: list[str | None] = []
        unplanned: list[int] = []
        for i, h in enumerate(hashes):
            t = requests.admission(BlockKey(namespace, h), now)
            if t is UNPLANNED:
                unplanned.append(i)
                out.append(None)
            else:
                out.append(t)
        if unplanned:
            opened = requests.get(namespace, request_id)
            session = (opened.session if opened is not None else
                       self._session(namespace, session_id, [hashes[i] for i in unplanned]))
            keys = [BlockKey(namespace, hashes[i]) for i in unplanned]
            req = self._request_info(namespace, keys, [None] * len(keys), session, workload, 0,
                                     block_bytes)
            if last_tokens:
                req = replace(req, last_tokens=last_tokens)
            plan = self.policy.on_request(req, now)
            self.sessions.used(session, keys, now)
            for i, k in zip(unplanned, keys, strict=True):
                out[i] = plan.admit.get(k)
            if plan.moves:
                self._schedule(plan.moves, "plan")
        return out

    def request_keys(self, namespace: str, hashes: Sequence[bytes], request_id: Hashable,
                     parent: bytes | None = None) -> set[Hashable]:
        """Keys a store must not evict: the blocks of the request being stored (without
        a known request: the blocks stored and the prefix above ``parent``)."""
        opened = self.requests.get(namespace, request_id)
        if opened is not None:
            return set(opened.keys)
        keys: set[Hashable] = {BlockKey(namespace, h) for h in hashes}
        blocks = self.index.blocks_of(namespace)
        while parent is not None and (entry := blocks.get(parent)) is not None:
            if entry.key in keys:
                break  # a cycle of parent links
            keys.add(entry.key)
            parent = entry.meta.parent_hash
        return keys

    # -- the operations -----------------------------------------------------------------
    async def put(self, namespace: str, blocks: Sequence[NewBlock], session_id: str = "",
                  workload: str = "", *, request_id: Hashable = "") -> tuple[int, int]:
        """Store blocks (gRPC path) where their request's plan says. Returns (stored,
        already present). When a tier cannot make room for a block (what is left is
        pinned, in flight, or the request's own blocks), the blocks before it stay
        stored and the rest are skipped; if none could be stored, TierFull."""
        wl = Workload.parse(workload)
        self.check_accepting()
        self.check_blocks(namespace, blocks)
        now = self.clock()
        index = self.index
        held = index.blocks_of(namespace)
        fresh: list[NewBlock] = []
        existing: list[Entry] = []
        for b in blocks:
            e = held.get(b.block_hash)
            if e is None:
                fresh.append(b)
            else:
                existing.append(e)
        last = fresh[-1].num_tokens if fresh else 0
        tiers = self.plan_admissions(namespace, [b.block_hash for b in fresh], last, session_id,
                                     wl.value, request_id, now,
                                     max((len(b.payload) for b in fresh), default=0))
        protect = self.request_keys(namespace, [b.block_hash for b in blocks], request_id,
                                    blocks[0].parent_hash if blocks else None)
        sid = self.meta_session(namespace, session_id, request_id,
                                [b.block_hash for b in blocks])
        placed: list[Entry] = []
        # Consecutive blocks bound for one tier are stored as a run: room is made once
        # for all of them (one eviction call), then each is written and indexed.
        run: list[BlockMeta] = []
        payloads: list[bytes | memoryview] = []
        run_tier = ""
        for b, tier in zip(fresh, tiers, strict=True):
            if tier is None or self.free_pending(BlockKey(namespace, b.block_hash)):
                continue  # refused; or its dropped copy is still held: store it next time
            if tier != run_tier and run:
                if not await self._store_run(run, payloads, run_tier, protect, placed):
                    run = []
                    break
                run, payloads = [], []
            run_tier = tier
            run.append(new_meta(namespace, b, xxhash.xxh3_64_intdigest(b.payload), sid, wl))
            payloads.append(b.payload)
        if run:
            await self._store_run(run, payloads, run_tier, protect, placed)
        self.touch_tail_first(existing + placed)
        self.stats.puts += 1
        return len(placed), len(existing)

    async def _store_run(self, metas: list[BlockMeta], payloads: list[bytes | memoryview],
                         tier: str, protect: set[Hashable], placed: list[Entry]) -> bool:
        """Store a run of a chain's blocks in ``tier``; False once a block could not be
        stored (the rest of the chain is skipped: it would extend a missing prefix).
        When a tier cannot make room (what is left is pinned, in flight, or the
        request's own blocks), the rest of the run spills into the next tier; at the
        last tier the blocks before stay stored, and if none could be, TierFull is
        raised."""
        index = self.index
        ns = metas[0].key.namespace
        # Room for the whole run at once; if not all of it can be made, each block below
        # makes what it can.
        total = sum(m.size for m in metas)
        tier_obj = self.tiers[tier]
        with contextlib.suppress(TierFull):
            await self.make_room(tier, min(total, tier_obj.capacity_bytes), protect, ns)
        room = tier_obj.can_fit(total) and self.fits_quota(ns, tier, total)
        get = index.get_hash
        for meta, payload in zip(metas, payloads, strict=True):
            if get(ns, meta.key.block_hash) is not None:
                continue  # a concurrent put stored it meanwhile
            try:
                if not await self.prefix_held(meta, tier, protect):
                    return False  # a persistent tier lacks its prefix, and cannot get it
                if room:  # made above for the whole run
                    await self.put_into(tier, meta, payload)
                    stored: Entry | None = self._stored(meta, tier)
                else:
                    stored = await self._store(meta, payload, tier, protect)
                if stored is None:
                    return False
                entry = stored
            except TierFull:
                # What is left here is pinned, in flight or this request's own blocks: the
                # rest of the run spills into the next tier, or stops at the last one.
                i = metas.index(meta)
                nxt = self._rank[tier] + 1
                if nxt < len(self.order):
                    return await self._store_run(metas[i:], payloads[i:], self.order[nxt],
                                                 protect, placed)
                self.stats.puts_cut += 1
                if not placed:
                    raise
                return False
            except Unavailable as exc:  # e.g. the shared tier is down: not stored, no error
                log.warning("block %s not stored in %s: %s", meta.key, tier, exc)
                return False
            self._after_store(entry)
            placed.append(entry)
            self.stats.bytes_in += meta.size
        if placed:
            last = placed[-1].meta
            self.geometry.observe(ns, last.size, max(m.num_tokens for m in metas))
        return True

    async def store_copy(self, meta: BlockMeta, payload: bytes | memoryview, tier: str,
                         request_id: Hashable = "") -> Entry | None:
        """Store a block a client wrote elsewhere (a shared-memory slot) in ``tier``;
        None if it is not stored: ``tier`` is persistent and its prefix cannot be
        made durable there first (see :meth:`prefix_held`)."""
        protect = self.request_keys(meta.key.namespace, [meta.key.block_hash], request_id)
        entry = await self._store(meta, payload, tier, protect)
        if entry is None:
            return None
        self.geometry.observe(meta.key.namespace, meta.size, meta.num_tokens)
        self._after_store(entry)
        return entry

    def meta_session(self, namespace: str, session_id: str, request_id: Hashable,
                     hashes: Sequence[bytes] = ()) -> str:
        """The session a new block is recorded under (unscoped: as the client named it,
        or as the engine inferred it from the request's chain)."""
        if session_id:
            return session_id
        opened = self.requests.get(namespace, request_id)
        if opened is not None:
            return opened.session.session_id
        if hashes:
            return self._session(namespace, "", hashes).session_id
        return ""

    def written_in_place(self, meta: BlockMeta, tier_name: str) -> Entry:
        """Record a block whose bytes a client already wrote into ``tier_name`` (a
        shared-memory slot): index it, tell the policy and the event stream, and queue
        its write-back, as :meth:`put` does for the bytes it stores itself."""
        entry = self._stored(meta, tier_name)
        self.geometry.observe(meta.key.namespace, meta.size, meta.num_tokens)
        self._after_store(entry)
        return entry

    def touch_tail_first(self, entries: Sequence[Entry]) -> None:
        """Touch a chain's blocks last to first, as vLLM frees them: under pressure
        a chain then loses its tail before its head."""
        now = self.clock()
        for entry in reversed(entries):
            if entry.tiers:
                self.policy.on_access(entry.key, entry.tiers[0], now)

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
            self.requests.forget(entry.key)
            self.retention.forget(entry.key)
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
        return len(entries)

    def hint(self, hint: Hint, namespace: str = "", request_id: Hashable = "") -> int:
        """A turn or session event: let the policy move that session's blocks.

        The session is the one of ``request_id`` in ``namespace`` (a request looked
        up before; its hint also ends it), else ``hint.session_id`` in ``namespace``. A session's
        end drops a block only if no other live session still needs it."""
        opened = self.requests.close(namespace, request_id)
        if opened is not None:
            session = opened.session
        elif hint.session_id and namespace:
            session = SessionKey(namespace, hint.session_id)
        else:
            raise InvalidArgument(
                "a hint names its session by namespace and session_id (sessions are scoped "
                "by namespace), or by namespace and the request_id of a request looked up "
                "before (request ids are scoped by namespace too)")
        now = self.clock()
        index = self.index
        held = [(k, e.tiers[0]) for k in self.sessions.keys(session)
                if (e := index.get(k)) is not None]  # type: ignore[arg-type]
        moves = self.policy.on_hint(replace(hint, session_id=session), held, now)
        if hint.event == "session_end":
            free = set(self.sessions.end(session))
            moves = [m for m in moves if m.dst is not None or m.key in free]
        return self._schedule(moves, f"hint:{hint.event}")

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
