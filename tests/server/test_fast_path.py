"""The save path's control plane and checksums (issue 25): one Reserve and one Commit
per request, the writer's checksum recorded instead of re-hashing the slots on the
server's event loop, and a writer whose checksum lies caught at the first read."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import grpc
import pytest
import xxhash

from kvstore import KVStoreClient
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from kvstore.client import BlockSpec, SlotBuffer
from kvstore.engine import dataplane
from kvstore.tiers.shm import attach_segment
from kvstore.types import BlockKey
from tests.blocks import make_chain

KiB, MiB = 2**10, 2**20


class _CountingXXHash:
    """``xxhash`` as the data plane sees it, counting its hashes and their threads."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def xxh3_64_intdigest(self, data: Any) -> int:
        self.threads.append(threading.current_thread().name)
        return int(xxhash.xxh3_64_intdigest(data))


def _count_calls(monkeypatch: pytest.MonkeyPatch, plane: Any, *names: str) -> Counter[str]:
    """Count the servicer's calls of the plane's ``names`` (one per RPC)."""
    calls: Counter[str] = Counter()
    for name in names:
        orig = getattr(plane, name)

        async def counted(*args: Any, orig: Any = orig, name: str = name, **kw: Any) -> Any:
            calls[name] += 1
            return await orig(*args, **kw)

        monkeypatch.setattr(plane, name, counted)
    return calls


def test_a_request_saves_with_one_reserve_and_one_commit(server, monkeypatch):
    # 127 blocks of 768 KiB (one vLLM request's save, 95 MiB): the old client sent a
    # Reserve/Commit pair per 32 MiB (three of each).
    blocks = make_chain(127, 768 * KiB, seed=11)
    specs = [BlockSpec(b.block_hash, b.parent_hash, tuple(b.token_ids), len(b.payload))
             for b in blocks]
    calls = _count_calls(monkeypatch, server.engine.plane, "reserve", "commit")

    def fill(batch: Sequence[tuple[int, SlotBuffer]]) -> None:
        for i, slot in batch:
            slot.view()[:] = blocks[i].payload

    with KVStoreClient(server.address, shared_memory=True) as c:
        assert c.put_in_place("m", specs, fill, request_id="r1") == 127
        assert calls == {"reserve": 1, "commit": 1}
        got = c.get("m", [b.block_hash for b in blocks])
    assert [g.payload if g else None for g in got] == [b.payload for b in blocks]


def test_the_server_records_the_writers_checksum_without_hashing(server, monkeypatch):
    counting = _CountingXXHash()
    monkeypatch.setattr(dataplane, "xxhash", counting)
    blocks = make_chain(20, 256 * KiB, seed=12)
    with KVStoreClient(server.address, shared_memory=True) as c:
        assert c.put("m", blocks) == 20
    assert counting.threads == []  # the commit read none of the 5 MiB it stored
    index = server.engine.index
    for b in blocks:
        entry = index.get(BlockKey("m", b.block_hash))
        assert entry is not None and entry.meta.checksum == xxhash.xxh3_64_intdigest(b.payload)


def _reserve(stub: Any, namespace: str, blocks: Sequence[Any]) -> list[pb.SlotDescriptor]:
    resv = stub.Reserve(pb.ReserveRequest(namespace=namespace,
                                          sizes=[len(b.payload) for b in blocks],
                                          block_hashes=[b.block_hash for b in blocks]))
    slots = list(resv.slots)
    for d, b in zip(slots, blocks, strict=True):
        seg = attach_segment(d.segment)
        try:
            seg.buf[d.offset:d.offset + d.length] = b.payload
        finally:
            seg.close()
    return slots


def _headers(blocks: Sequence[Any]) -> list[pb.BlockHeader]:
    return [pb.BlockHeader(block_hash=b.block_hash, parent_hash=b.parent_hash or b"",
                           token_ids=list(b.token_ids), size=len(b.payload)) for b in blocks]


def test_a_commit_without_checksums_is_hashed_off_the_event_loop(server, monkeypatch):
    counting = _CountingXXHash()
    monkeypatch.setattr(dataplane, "xxhash", counting)
    blocks = make_chain(8, 512 * KiB, seed=13)
    loop_thread = server._thread.name
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.KVStoreStub(ch)
        slots = _reserve(stub, "m", blocks)  # an older writer: no checksum sent
        assert stub.Commit(pb.CommitRequest(namespace="m", slots=slots,
                                            headers=_headers(blocks))).stored == 8
    assert len(counting.threads) == 8 and loop_thread not in counting.threads
    for b in blocks:
        entry = server.engine.index.get(BlockKey("m", b.block_hash))
        assert entry is not None and entry.meta.checksum == xxhash.xxh3_64_intdigest(b.payload)


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "grpc"])
def test_a_writer_whose_checksum_lies_is_caught_at_the_first_read(server, shared_memory):
    blocks = make_chain(3, 64 * KiB, seed=14)
    hashes = [b.block_hash for b in blocks]
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.KVStoreStub(ch)
        slots = _reserve(stub, "m", blocks)
        for d, b in zip(slots, blocks, strict=True):
            d.checksum = xxhash.xxh3_64_intdigest(b.payload)
        slots[1].checksum ^= 1  # block 1's writer sends a checksum its bytes do not have
        assert stub.Commit(pb.CommitRequest(namespace="m", slots=slots,
                                            headers=_headers(blocks))).stored == 3
    with KVStoreClient(server.address, shared_memory=shared_memory) as c:
        assert c.uses_shared_memory is shared_memory
        got = c.get("m", hashes)
        assert got[0] is not None and got[0].payload == blocks[0].payload
        assert got[1] is None  # refused: its bytes do not match what was recorded
        assert got[2] is not None and got[2].payload == blocks[2].payload
        assert c.stats().corrupt_reads >= 1
        server.drain()
        # dropped (its copy to disk refused the mismatch too): the prefix ends before it
        assert c.lookup("m", hashes).num_hit == 1


def test_stats_report_the_event_loops_lag(server):
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.KVStoreStub(ch)
        stub.Stats(pb.StatsRequest())
        threading.Event().wait(0.3)
        lag = stub.Stats(pb.StatsRequest(loop_lag_window_s=60)).loop_lag
    assert lag.samples >= 10  # one every 5 ms while the server ran
    assert 0 <= lag.p50_ms <= lag.p99_ms <= lag.max_ms < 60_000


def test_a_large_delete_lets_the_event_loop_run_other_calls(server_factory):
    import asyncio

    server = server_factory(disk={"enabled": False})  # DRAM deletes never wait on I/O
    blocks = make_chain(1024, 4 * KiB, seed=15)
    with KVStoreClient(server.address, shared_memory=True) as c:
        assert c.put("m", blocks) == 1024

    async def race() -> tuple[int, int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        deleted = await server.engine.delete("m", [])
        done.set()
        await task
        return deleted, ticks - before

    deleted, ran = server.run(race())
    assert deleted == 1024
    assert ran >= 3  # other calls ran while the 1,024 blocks were deleted
    with KVStoreClient(server.address) as c:
        assert c.lookup("m", [b.block_hash for b in blocks]).num_hit == 0


def test_stats_report_the_loops_busy_lag_apart_from_the_timers(server):
    # The busy sampler (a callback posted from another thread) reports its own samples.
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.KVStoreStub(ch)
        stub.Stats(pb.StatsRequest())
        threading.Event().wait(0.3)
        lag = stub.Stats(pb.StatsRequest(loop_lag_window_s=60)).loop_lag
    assert lag.busy_samples >= 10
    assert 0 <= lag.busy_p50_ms <= lag.busy_p99_ms <= lag.busy_max_ms < 60_000


def test_the_busy_lag_counts_work_that_holds_the_loop():
    import asyncio
    import time

    from kvstore.server.looplag import LoopLag

    async def main() -> float:
        lag = LoopLag(interval_s=0.002)
        task = asyncio.get_running_loop().create_task(lag.run())
        await asyncio.sleep(0.1)
        assert lag.busy_summary(60).samples >= 5
        time.sleep(0.08)  # a handler that holds the loop for 80 ms
        await asyncio.sleep(0.1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return lag.busy_summary(60).max_ms

    assert asyncio.run(main()) >= 50  # a callback posted meanwhile waited for it


def test_the_busy_lag_counts_work_that_keeps_the_gil():
    # Python running on the loop keeps the GIL: the sampler's thread cannot even post
    # until it lets go. Its callback is stamped with the time it was due, so that wait
    # counts (a stamp taken once the thread ran read these holds as ~0.1 ms).
    import asyncio
    import time

    from kvstore.server.looplag import LoopLag

    async def main() -> tuple[float, float]:
        lag = LoopLag(interval_s=0.002)
        task = asyncio.get_running_loop().create_task(lag.run())
        await asyncio.sleep(0.05)
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            hold = time.perf_counter() + 0.008
            while time.perf_counter() < hold:  # 8 ms of Python: the GIL kept
                pass
            await asyncio.sleep(0.002)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        busy = lag.busy_summary(60)
        return busy.p99_ms, busy.max_ms

    p99, most = asyncio.run(main())
    # (a sample falls due in each hold and waits for most of it: the old stamp read
    # the longest as ~1 ms)
    assert most >= 5
    assert p99 >= 4


def _seen_commits(monkeypatch: pytest.MonkeyPatch, plane: Any) -> list[list[Any]]:
    """The slots of each commit the servicer hands the plane (descriptors or ids)."""
    seen: list[list[Any]] = []
    orig = plane.commit

    async def commit(namespace: str, items: Any, *args: Any, **kw: Any) -> int:
        seen.append([desc for desc, _ in items])
        return await orig(namespace, items, *args, **kw)

    monkeypatch.setattr(plane, "commit", commit)
    return seen


def test_the_clients_commit_by_slot_id_alone(server, monkeypatch):
    # The server says it takes the packed form; the clients then send slot ids and
    # checksums in two packed arrays, not a descriptor message per block.
    seen = _seen_commits(monkeypatch, server.engine.plane)
    blocks = make_chain(6, 64 * KiB, seed=15)
    with KVStoreClient(server.address, shared_memory=True) as c:
        assert c.put("m", blocks) == 6
        got = c.get("m", [b.block_hash for b in blocks])
    assert [g.payload if g else None for g in got] == [b.payload for b in blocks]
    assert len(seen) == 1 and all(isinstance(d, int) for d in seen[0])
    for b in blocks:  # the writer's checksums, recorded
        entry = server.engine.index.get(BlockKey("m", b.block_hash))
        assert entry is not None and entry.meta.checksum == xxhash.xxh3_64_intdigest(b.payload)


def test_a_packed_commit_names_what_is_wrong_and_the_server_goes_on(server):
    blocks = make_chain(3, 64 * KiB, seed=16)
    sums = [xxhash.xxh3_64_intdigest(b.payload) for b in blocks]
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.KVStoreStub(ch)
        slots = _reserve(stub, "m", blocks)
        ids = [d.slot_id for d in slots]

        def status(**fields: Any) -> tuple[grpc.StatusCode, str]:
            with pytest.raises(grpc.RpcError) as info:
                stub.Commit(pb.CommitRequest(namespace="m", **fields))
            return info.value.code(), info.value.details()

        headers = _headers(blocks)
        code, msg = status(slot_ids=ids, slots=slots, headers=headers)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "slots or slot_ids, not both" in msg
        code, msg = status(slot_ids=ids[:2], headers=headers)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "2 slot_ids but 3 headers" in msg
        code, msg = status(slot_ids=ids, checksums=sums[:1], headers=headers)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "1 checksums for 3 slot_ids" in msg
        code, msg = status(slot_ids=[ids[0], ids[1], 987654321], checksums=sums,
                           headers=headers)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "slot 987654321 was never reserved" in msg
        # a slot committed as another block than the one it was reserved for
        code, msg = status(slot_ids=[ids[2]], checksums=sums[:1], headers=headers[:1])
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "was reserved for" in msg
        # the first two went in with the commit the unknown id stopped; the third's
        # reservation is still there, and a packed commit of it stores it
        assert stub.Commit(pb.CommitRequest(namespace="m", slot_ids=ids[2:], checksums=sums[2:],
                                            headers=headers[2:])).stored == 1
    with KVStoreClient(server.address, shared_memory=True) as c:
        got = c.get("m", [b.block_hash for b in blocks])
    assert [g.payload if g else None for g in got] == [b.payload for b in blocks]


def test_a_client_of_a_server_without_the_packed_form_sends_descriptors(server, monkeypatch):
    # A server of an earlier release does not say packed_commit: its Commit wants
    # descriptors, and the client sends them (with its checksums in them).
    orig_call = KVStoreClient._call

    def older(self: Any, fn: Any, request: Any, **kw: Any) -> Any:
        resp = orig_call(self, fn, request, **kw)
        if isinstance(resp, pb.SegmentsResponse):
            resp.packed_commit = False
        return resp

    monkeypatch.setattr(KVStoreClient, "_call", older)
    seen = _seen_commits(monkeypatch, server.engine.plane)
    blocks = make_chain(4, 64 * KiB, seed=17)
    with KVStoreClient(server.address, shared_memory=True) as c:
        assert c.put("m", blocks) == 4
        got = c.get("m", [b.block_hash for b in blocks])
    assert [g.payload if g else None for g in got] == [b.payload for b in blocks]
    assert len(seen) == 1 and not any(isinstance(d, int) for d in seen[0])
    for b in blocks:
        entry = server.engine.index.get(BlockKey("m", b.block_hash))
        assert entry is not None and entry.meta.checksum == xxhash.xxh3_64_intdigest(b.payload)
