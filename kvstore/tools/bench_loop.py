"""``kvstore bench-loop``: the event loop's CPU per call, in process.

What a call costs the server's event loop, timed as the loop thread's CPU time
(``time.thread_time``) rather than wall time, so that other jobs on a shared machine
move it little: the Lookup of 1,000 stored hashes (request parsed and response
serialised as gRPC would; without a session, as ``kvstore bench`` sends it, and with
one; to the answer, and what it leaves for the loop's next turns), and Reserve, Commit
(the payloads written into the slots and their checksums sent, as a client does) and
Acquire per block of a batch, each batch stored the two ways clients
store: after a Lookup of the same ``request_id`` (the vLLM connector's path: the Reserve
reuses the lookup's plan) and without one (the LMCache plugin's: the Reserve asks the
policy for a plan of its own). Everything but the transport is the
served path: the server is :class:`~kvstore.server.app.KVStoreServer` on the embedded defaults
``kvstore serve`` starts with (DRAM and disk; ``--dram-only``: the server ``kvstore
bench`` starts), on the loop ``kvstore serve`` runs (:func:`~kvstore.server.app.run_served`),
and every call goes to the servicer object its gRPC server runs
(``KVStoreServer.servicer``), after the blocks were written back to disk.

Also, per Reserve / Commit / Acquire call, the longest the loop went without giving
another task a turn (wall time: what any other call waits behind it at worst; a task that
only yields takes those turns, and its few microseconds each are in the CPU figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kvstore.server.app import run_served

__all__ = ["main", "run", "served_config"]


class _Context:
    """The little of a gRPC servicer context the servicer reads."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def set_trailing_metadata(self, md: Any) -> None:
        pass

    def set_code(self, code: Any) -> None:
        raise RuntimeError(f"the call failed: {code}")

    def set_details(self, details: str) -> None:
        pass

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


#: the calls timed per block: after the request's Lookup, and a store without one
_OPS = ("reserve", "commit", "acquire", "reserve_alone", "commit_alone")


def _cpu_us(samples: list[float], per: int) -> dict[str, float]:
    s = sorted(x / per * 1e6 for x in samples)
    return {"min_us": round(s[0], 2), "p50_us": round(statistics.median(s), 2)}


class _Holds:
    """The longest the loop went without running a ready callback while a call ran: a
    task that only yields records the gaps between its turns (its wait behind the call,
    as another call's would be)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    async def __aenter__(self) -> _Holds:
        self.longest = 0.0
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)  # (its first turn: it waits from here)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        await asyncio.sleep(0)  # (its turn after the call: the gap it spans is counted)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def served_config(data_dir: str, batch_bytes: int = 0, dram_only: bool = False) -> Any:
    """``kvstore serve``'s embedded defaults (the environment's ``KVSTORE_*`` ignored) on
    ``data_dir``, a free loopback port, no metrics port and loopback event sockets; the
    DRAM tier grown to hold two batches of ``batch_bytes`` if its default would not.
    ``dram_only``: no disk tier (the server ``kvstore bench`` starts)."""
    from kvstore.config import load_config
    from kvstore.tiers.dramconfig import DramConfig
    from kvstore.tools.harness import free_port

    overrides: dict[str, Any] = {
        "data_dir": data_dir,
        "server": {"listen": f"127.0.0.1:{free_port()}", "metrics_port": 0},
        "events": {"endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*"}}
    if 2 * batch_bytes + (64 << 20) > DramConfig().capacity:
        overrides["dram"] = {"capacity": 2 * batch_bytes + (64 << 20)}
    if dram_only:
        overrides["disk"] = {"enabled": False}
    return load_config(env={}, overrides=overrides)


async def _written_back(eng: Any, namespace: str, hashes: list[bytes],
                        within_s: float = 30.0) -> None:
    """Until every block of ``hashes`` is in every tier (the disk write-back done: the
    state a served lookup of them finds), or ``within_s``."""
    deadline = time.monotonic() + within_s
    blocks = eng.index.blocks_of(namespace)
    while time.monotonic() < deadline and not all(
            len(blocks[h].tiers) == len(eng.tiers) for h in hashes if h in blocks):
        await asyncio.sleep(0.05)


async def _run(lookups: int, block: int, blocks: int, batches: int, dram_only: bool
               ) -> dict[str, Any]:
    import xxhash

    from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
    from kvstore.client.segments import SegmentCache
    from kvstore.server.app import KVStoreServer
    from kvstore.server.heap import settle_startup
    from kvstore.tools.measure import make_blocks

    data = tempfile.mkdtemp(prefix="kvstore-bench-loop-")
    srv = KVStoreServer(served_config(data, block * blocks, dram_only))
    segments = SegmentCache()
    await srv.start()
    settle_startup()
    ctx = _Context()
    try:
        assert srv.engine is not None and srv.servicer is not None
        eng, sv = srv.engine, srv.servicer
        # -- Lookup of 1,000 stored hashes --------------------------------------------
        chain = make_blocks(1000, 4096, seed=3)
        put = pb.PutRequest(namespace="bench-lookup")
        for b in chain:
            put.blocks.add(header=pb.BlockHeader(block_hash=b.block_hash,
                                                 parent_hash=b.parent_hash or b"",
                                                 token_ids=b.token_ids), payload=b.payload)

        async def one_put() -> AsyncIterator[pb.PutRequest]:
            yield put

        await sv.Put(one_put(), ctx)
        await _written_back(eng, "bench-lookup", [b.block_hash for b in chain])
        lookup_cpu: dict[str, list[float]] = {"": [], "bench-session": []}
        #: per Lookup, the loop's CPU right after the answer (the hits' bookkeeping)
        after_cpu: dict[str, list[float]] = {"": [], "bench-session": []}
        for session, cpu_of in lookup_cpu.items():
            wire = pb.LookupRequest(namespace="bench-lookup", session_id=session,
                                    block_hashes=[b.block_hash for b in chain]
                                    ).SerializeToString()
            for i in range(lookups + 20):
                t = time.thread_time()
                resp = await sv.Lookup(pb.LookupRequest.FromString(wire), ctx)
                resp.SerializeToString()
                t_answer = time.thread_time() - t
                t = time.thread_time()
                # (the loop free: what the Lookup left for then, two turns on)
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                if i >= 20:  # (the first ones warm up)
                    cpu_of.append(t_answer)
                    after_cpu[session].append(time.thread_time() - t)
                if resp.num_hit != 1000:
                    raise RuntimeError(f"lookup found {resp.num_hit} of 1000")
        # -- Reserve / Commit / Acquire per block ---------------------------------------
        batch = make_blocks(blocks, block, seed=1)
        sums = [xxhash.xxh3_64_intdigest(b.payload) for b in batch]
        headers = [pb.BlockHeader(block_hash=b.block_hash, parent_hash=b.parent_hash or b"",
                                  token_ids=b.token_ids) for b in batch]
        #: per call of each path ("" after the request's Lookup: the vLLM connector's;
        #: "alone": a store no Lookup announced, the LMCache plugin's), its thread CPU
        cpu: dict[str, list[float]] = {op: [] for op in _OPS}
        #: per call, the longest the loop was held between two turns of another task
        held: dict[str, list[float]] = {op: [] for op in _OPS}
        holds = _Holds()
        hashes = [b.block_hash for b in batch]
        for rep in range(batches + 2):
            for path in ("", "alone"):
                ns = f"bench-loop-{rep}{'-' + path if path else ''}"
                rid = "" if path else f"bench-request-{rep}"
                if rid:  # the connector looks the request up first: its plan is reused
                    await sv.Lookup(pb.LookupRequest(namespace=ns, block_hashes=hashes,
                                                     request_id=rid), ctx)
                req = pb.ReserveRequest(namespace=ns, block_hashes=hashes, request_id=rid,
                                        sizes=[block] * blocks).SerializeToString()
                async with holds:
                    t = time.thread_time()
                    resv = await sv.Reserve(pb.ReserveRequest.FromString(req), ctx)
                    wire_resv = resv.SerializeToString()
                    t_reserve = time.thread_time() - t
                h_reserve = holds.longest
                resv = pb.ReserveResponse.FromString(wire_resv)
                for s, b in zip(resv.slots, batch, strict=True):
                    segments.region(s)[:] = b.payload  # (the writer's copy, not timed)
                # (the clients' packed form: slot ids and checksums)
                commit = pb.CommitRequest(namespace=ns, slot_ids=[s.slot_id for s in resv.slots],
                                          checksums=sums, headers=headers,
                                          request_id=rid).SerializeToString()
                async with holds:
                    t = time.thread_time()
                    stored = (await sv.Commit(pb.CommitRequest.FromString(commit), ctx)).stored
                    t_commit = time.thread_time() - t
                h_commit = holds.longest
                if stored != blocks:
                    raise RuntimeError(f"commit stored {stored} of {blocks}")
                times = {"reserve": (t_reserve, h_reserve), "commit": (t_commit, h_commit)}
                if not path:
                    acq = pb.AcquireRequest(namespace=ns, block_hashes=hashes
                                            ).SerializeToString()
                    async with holds:
                        t = time.thread_time()
                        lease = await sv.Acquire(pb.AcquireRequest.FromString(acq), ctx)
                        lease.SerializeToString()
                        t_acquire = time.thread_time() - t
                    times["acquire"] = (t_acquire, holds.longest)
                    await sv.Release(pb.ReleaseRequest(lease_id=lease.lease_id), ctx)
                # (written back before the delete: a slot committed with the wrong bytes
                # fails its write-back's checksum, and ``transfers_failed`` says so)
                await _written_back(eng, ns, hashes)
                await eng.delete(ns, hashes)
                if rep >= 2:
                    for op, (cpu_s, hold_s) in times.items():
                        key = f"{op}_{path}" if path else op
                        cpu[key].append(cpu_s)
                        held[key].append(hold_s)
        return {
            "load_average": round(os.getloadavg()[0], 2), "policy": eng.policy.name,
            "tiers": list(eng.tiers), "transfers_failed": eng.mover.failed,
            **{key: {"calls": lookups, **{k.replace("_us", "_ms"): round(v / 1e3, 3)
                                          for k, v in _cpu_us(lookup_cpu[session], 1).items()},
                     "after_p50_ms": round(statistics.median(after_cpu[session]) * 1e3, 3)}
               for key, session in (("lookup_1000", ""), ("lookup_1000_named", "bench-session"))},
            "per_block": {"block": block, "blocks": blocks, "batches": batches,
                          **{op: _cpu_us(v, blocks) for op, v in cpu.items()}},
            "longest_hold_ms": {op: {"p50": round(statistics.median(v) * 1e3, 3),
                                     "max": round(max(v) * 1e3, 3)}
                                for op, v in held.items() if v},
        }
    finally:
        segments.close()
        await srv.stop(0)
        gc.unfreeze()  # (a process that goes on, a test's: its objects collected again)


def run(lookups: int = 300, block: int = 64 << 10, blocks: int = 512, batches: int = 10,
        dram_only: bool = False) -> dict[str, Any]:
    return run_served(_run(lookups, block, blocks, batches, dram_only))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvstore bench-loop", description=__doc__.split("\n")[0])
    p.add_argument("--lookups", type=int, default=300, help="Lookups timed (default 300)")
    p.add_argument("--block-kib", type=int, default=64, help="block size, KiB (default 64)")
    p.add_argument("--blocks", type=int, default=512, help="blocks per batch (default 512)")
    p.add_argument("--batches", type=int, default=10, help="batches timed (default 10)")
    p.add_argument("--dram-only", action="store_true",
                   help="no disk tier (the server kvstore bench starts)")
    p.add_argument("--json", help="write the results as JSON here")
    args = p.parse_args(argv)
    r = run(args.lookups, args.block_kib << 10, args.blocks, args.batches, args.dram_only)
    pb_ = r["per_block"]
    print(f"event-loop CPU per call (policy {r['policy']}, tiers {'+'.join(r['tiers'])}, "
          f"load {r['load_average']}):")
    for key, what in (("lookup_1000", "no session"), ("lookup_1000_named", "a session")):
        lk = r[key]
        print(f"  Lookup of 1,000 stored hashes, {what}: p50 {lk['p50_ms']:.3f} ms, "
              f"min {lk['min_ms']:.3f} ms to the answer; then p50 {lk['after_p50_ms']:.3f} ms "
              "once the loop is free (the hits' bookkeeping)")
    hold = r["longest_hold_ms"]
    for ops, what in ((("reserve", "commit", "acquire"), "after the request's Lookup"),
                      (("reserve_alone", "commit_alone"), "a store without a Lookup")):
        print(f"  per {pb_['block'] >> 10} KiB block, batches of {pb_['blocks']}, {what}: "
              + ", ".join(f"{op.split('_')[0]} p50 {pb_[op]['p50_us']:.1f} us "
                          f"(min {pb_[op]['min_us']:.1f})" for op in ops))
        print(f"    longest the loop was held by one call of {pb_['blocks']} blocks: "
              + ", ".join(f"{op.split('_')[0]} p50 {hold[op]['p50']:.3f} ms "
                          f"(max {hold[op]['max']:.3f})" for op in ops if op in hold))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0
