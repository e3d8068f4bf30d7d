"""The connector's data path without vLLM: KV tensors in vLLM's layouts, real sidecar.

Layouts are built the way vLLM 0.32 builds them (``kv_layouts.py``). Every test
runs on ``KVSTORE_TEST_DEVICE`` (default ``cpu``); ``scripts/gpu_check.sh`` runs
this file again with ``cuda`` on a GPU machine, where the device tests go
through pinned staging, CUDA streams and events.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvstore.connectors.vllm.devicekv import DeviceKV, HostPool  # noqa: E402
from kvstore.connectors.vllm.hostkv import HostKV  # noqa: E402
from kvstore.connectors.vllm.layout import KVLayout  # noqa: E402
from kvstore.connectors.vllm.loads import Checker, DirectLoad, LayerwiseLoad, LoadJob  # noqa: E402
from kvstore.connectors.vllm.payload import (  # noqa: E402
    HEADER_SIZE,
    PayloadError,
    check_header,
    layout_digest,
    seal,
    slot_matches,
    unpack_body,
)
from kvstore.connectors.vllm.plans import BlockSave, SavePlan  # noqa: E402
from kvstore.connectors.vllm.rows import ByteRows, SlotArrays, copy_rows  # noqa: E402
from kvstore.connectors.vllm.saves import SaveJob, SaveQueue, SaveResult  # noqa: E402
from kvstore.connectors.vllm.sidecar import SidecarLink  # noqa: E402

from kvstore.client import SlotBuffer  # noqa: E402
from tests.vllm.kv_layouts import LAYOUTS, make_kv_caches  # noqa: E402

DEVICE = torch.device(os.environ.get("KVSTORE_TEST_DEVICE", "cpu"))
NB = 12  # engine blocks
RAW = {"LBHNC", "LBNHC", "BLHNC"}  # layouts whose blocks are contiguous runs


def caches(layout: str, seed: int = 0, ratio: int = 1, dtype: Any = None) -> dict[str, Any]:
    return make_kv_caches(layout, num_blocks=NB, kernel_ratio=ratio, seed=seed, device=DEVICE,
                          dtype=dtype or torch.float32)


def kv_for(layout: KVLayout) -> HostKV | DeviceKV:
    return HostKV(layout) if layout.device.type == "cpu" else DeviceKV(layout)


# -- layouts ------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_rows_and_round_trip_in_every_vllm_layout(name: str, ratio: int) -> None:
    a = KVLayout(caches(name, 0, ratio), NB)
    b = KVLayout(caches(name, 1, ratio), NB)
    assert a.signature == b.signature
    # (BLHNC with kernel blocks interleaves layers inside a block: vLLM refuses it,
    # the connector falls back to the logical order.)
    raw = name in RAW and not (name == "BLHNC" and ratio > 1)
    assert all((layer.rows is not None) is raw for layer in a.layers)
    for layer in a.layers:
        if layer.rows is not None:  # row b is block b's bytes, in memory order
            block = layer.tensor.narrow(layer.axis, 3 * ratio, ratio)
            assert layer.rows[3].numel() == block.numel() * block.element_size()
            assert torch.equal(layer.rows[3].view(layer.tensor.dtype).sort().values,
                               block.reshape(-1).sort().values)
    ids = [5, 0, 11, 2]
    b.scatter(ids, a.gather(ids))
    assert torch.equal(a.gather(ids), b.gather(ids))
    assert not torch.equal(a.gather([1]), b.gather([1]))  # others untouched


def test_layout_signature_tells_byte_orders_apart() -> None:
    sigs = {name: KVLayout(caches(name), NB).signature for name in LAYOUTS}
    # Head-major blocks read the same bytes whatever the order of L and B ...
    assert sigs["LBHNC"] == sigs["BLHNC"] == sigs["LHBNC"]
    # ... token-major blocks (FlashAttention) and K/V-first tensors do not.
    assert len({sigs["LBHNC"], sigs["LBNHC"], sigs["kv-first"]}) == 3
    a, b = KVLayout(caches("LBHNC", 0), NB), KVLayout(caches("LHBNC", 1), NB)
    b.scatter([1, 2], a.gather([4, 5]))
    for name in a.index:
        ta, tb = a.layers[a.index[name]].tensor, b.layers[b.index[name]].tensor
        assert torch.equal(ta[4:6], tb[1:3])


def test_layout_maps_shared_layers_to_their_source() -> None:
    kv = caches("LBHNC")
    kv["model.layers.9.self_attn.attn"] = kv["model.layers.0.self_attn.attn"]
    layout = KVLayout(kv, NB)
    assert len(layout.layers) == 2
    assert layout.index["model.layers.9.self_attn.attn"] == 0


# -- rows -----------------------------------------------------------------------------


def test_copy_rows_coalesces_evenly_spaced_rows() -> None:
    src = np.arange(64 * 10, dtype=np.uint8)
    dst = np.zeros(100 * 10, dtype=np.uint8)
    # Rows 0-3 evenly spaced on both sides, then a jump, then two more.
    s_off = [0, 64, 128, 192, 448, 512]
    d_off = [0, 100, 200, 300, 700, 800]
    copies = copy_rows(ByteRows.uniform(dst, d_off, 48), ByteRows.uniform(src, s_off, 48))
    assert copies == 2
    for s, d in zip(s_off, d_off, strict=True):
        assert bytes(dst[d : d + 48]) == bytes(src[s : s + 48])
    assert not dst[48:100].any()


def test_copy_rows_never_overlaps_destination_rows_and_checks_sizes() -> None:
    src = np.arange(256, dtype=np.uint8)
    dst = np.zeros(256, dtype=np.uint8)
    # Destination rows 8 bytes apart but 16 long: copied one by one, last wins.
    copy_rows(ByteRows.uniform(dst, [0, 8], 16), ByteRows.uniform(src, [100, 200], 16))
    assert bytes(dst[8:24]) == bytes(src[200:216])
    with pytest.raises(ValueError, match="rows"):
        copy_rows(ByteRows.uniform(dst, [0], 16), ByteRows.uniform(src, [0, 16], 16))
    with pytest.raises(ValueError, match="outside their buffer"):
        copy_rows(ByteRows.uniform(dst, [0, 220], 50), ByteRows.uniform(src, [0, 50], 50))
    with pytest.raises(ValueError, match="outside their buffer"):
        copy_rows(ByteRows.uniform(dst, [250], 50), ByteRows.uniform(src, [0], 50))


# -- payload in place ---------------------------------------------------------------------


def test_seal_and_check_in_place() -> None:
    import xxhash

    digest = layout_digest("ns", "layout")
    buf = memoryview(bytearray(1000))
    body = os.urandom(400)
    buf[100 + HEADER_SIZE : 100 + HEADER_SIZE + 400] = body
    seal(buf, 100, HEADER_SIZE + 400, digest, b"h" * 32)
    check_header(buf, 100, HEADER_SIZE + 400, digest, b"h" * 32, 400)
    # The checksum is the slot's (header and body), as the client commits it.
    checksum = xxhash.xxh3_64_intdigest(buf[100 : 100 + HEADER_SIZE + 400])
    assert slot_matches(buf, 100, HEADER_SIZE + 400, checksum)
    payload = bytes(buf[100 : 100 + HEADER_SIZE + 400])
    assert bytes(unpack_body(payload, digest, b"h" * 32, 400, checksum)) == body
    with pytest.raises(PayloadError, match="another block hash"):
        check_header(buf, 100, HEADER_SIZE + 400, digest, b"g" * 32, 400)
    buf[100 + HEADER_SIZE + 7] ^= 1
    assert not slot_matches(buf, 100, HEADER_SIZE + 400, checksum)
    buf[100 + HEADER_SIZE + 7] ^= 1
    buf[100 + 20] ^= 1  # a reserved header byte: the header is checked by the checksum too
    assert not slot_matches(buf, 100, HEADER_SIZE + 400, checksum)


# -- host and device movers -------------------------------------------------------------


def _slots(n: int, body: int, gap: int = 0) -> tuple[bytearray, list[SlotBuffer]]:
    size = HEADER_SIZE + body
    seg = bytearray((size + gap) * n + 64)
    view = memoryview(seg)
    return seg, [SlotBuffer(view, 64 + i * (size + gap), size) for i in range(n)]


@pytest.mark.parametrize("name", LAYOUTS)
def test_movers_write_bodies_and_read_them_back(name: str) -> None:
    a, b = KVLayout(caches(name, 0, 2), NB), KVLayout(caches(name, 1, 2), NB)
    src_ids, dst_ids = [3, 4, 5, 9], [0, 1, 7, 8]
    _, slots = _slots(4, a.block_bytes, gap=64 if name == "LBNHC" else 0)
    arrays = SlotArrays()
    bodies = arrays.rows(slots, HEADER_SIZE, a.block_bytes)
    kv_a, kv_b = kv_for(a), kv_for(b)
    if isinstance(kv_a, HostKV):
        kv_a.to_bodies(src_ids, bodies)
    else:
        kv_a.snapshot_to_bodies(kv_a.snapshot(src_ids), range(4), bodies)
    expected = a.gather(src_ids)
    for i, slot in enumerate(slots):
        got = np.frombuffer(slot.view()[HEADER_SIZE:], dtype=np.uint8)
        assert np.array_equal(got, expected[i].numpy())
    if isinstance(kv_b, HostKV):
        kv_b.from_bodies(dst_ids, bodies)
    else:
        load = kv_b.staged_load(dst_ids)
        load.stage(range(4), bodies)
        load.finish()
        assert all(load.wait_layer(i, 5.0) for i in range(len(b.layers)))
        if DEVICE.type == "cuda":
            torch.cuda.synchronize(DEVICE)
        load.release()
    assert torch.equal(b.gather(dst_ids), expected)


@pytest.mark.parametrize("name", sorted(RAW))
def test_a_host_load_copies_and_checks_each_slot_in_one_pass(name: str) -> None:
    """The direct load's copy-and-check: every block lands, a slot whose bytes do not
    hash to its checksum is named (its header or its body), one without a checksum is
    copied unchecked."""
    import xxhash

    if DEVICE.type != "cpu":
        pytest.skip("host KV only")
    a, b = KVLayout(caches(name, 0), NB), KVLayout(caches(name, 1), NB)
    kv_a, kv_b = HostKV(a), HostKV(b)
    assert kv_b.direct
    src_ids, dst_ids = [3, 4, 5, 9, 10], [0, 1, 7, 8, 2]
    seg, slots = _slots(5, a.block_bytes, gap=64)
    kv_a.to_bodies(src_ids, SlotArrays().rows(slots, HEADER_SIZE, a.block_bytes))
    for i, slot in enumerate(slots):
        seg[slot.offset:slot.offset + HEADER_SIZE] = bytes([i + 1]) * HEADER_SIZE
    sums = [xxhash.xxh3_64_intdigest(slot.view()) for slot in slots]
    seg[slots[1].offset + HEADER_SIZE + a.block_bytes - 1] ^= 1  # the body's last byte
    seg[slots[2].offset + 3] ^= 1  # a header byte
    checked = [SlotBuffer(s.buffer, s.offset, s.length, c)
               for s, c in zip(slots, sums, strict=True)]
    checked[4] = SlotBuffer(slots[4].buffer, slots[4].offset, slots[4].length)  # none
    assert kv_b.from_slots_checked(dst_ids, checked, HEADER_SIZE) == [1, 2]
    expected = a.gather(src_ids)
    got = b.gather(dst_ids)
    for i in (0, 2, 3, 4):
        assert torch.equal(got[i], expected[i])
    assert not torch.equal(got[1], expected[1])  # copied as it was, and named


def test_staged_load_releases_layers_one_by_one_and_cancels() -> None:
    layout = KVLayout(caches("LBNHC", 0), NB)
    source = KVLayout(caches("LBNHC", 1), NB)
    kv = DeviceKV(layout)
    _, slots = _slots(3, layout.block_bytes)
    bodies = SlotArrays().rows(slots, HEADER_SIZE, layout.block_bytes)
    HostKV(KVLayout(make_kv_caches("LBNHC", num_blocks=NB, seed=1), NB)).to_bodies(
        [1, 2, 3], bodies)
    ids = layout.ids([4, 5, 6])
    layer0, layer1 = layout.layers
    before = layer1.gather_rows(ids).clone()
    load = kv.staged_load([4, 5, 6])
    load.stage(range(3), bodies)
    assert not load.wait_layer(0, 0.01)  # staged, not launched: the forward would wait
    load.launch(0, range(3))
    assert load.wait_layer(0, 0.0) and not load.wait_layer(1, 0.01)
    load.cancel()  # late: nothing more is launched, nobody waits any more
    load.launch(1, range(3))
    assert load.wait_layer(1, 0.0)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    assert torch.equal(layer0.gather_rows(ids).cpu(),
                       source.layers[0].gather_rows(source.ids([1, 2, 3])).cpu())
    assert torch.equal(layer1.gather_rows(ids), before)  # cancelled: never written
    load.release()


def test_host_pool_reuses_buffers() -> None:
    pool = HostPool(pin=False)
    a = pool.take(3 * 2**20)
    assert a.numel() >= 3 * 2**20
    pool.give(a)
    assert pool.take(2**20) is a


# -- against a real sidecar -------------------------------------------------------------


@pytest.fixture
def link(server: Any) -> Iterator[SidecarLink]:
    link = SidecarLink(server.address, 5.0, 1.0)
    yield link
    link.close()


def _plan(hashes: list[bytes], ids: list[int], req: str = "r1") -> SavePlan:
    blocks = tuple(
        BlockSave(h, hashes[i - 1] if i else None, (i,), b)
        for i, (h, b) in enumerate(zip(hashes, ids, strict=True))
    )
    return SavePlan(req, "s1", "agent", blocks)


def _save(queue: SaveQueue, results: list[SaveResult], plans: list[SavePlan]) -> SaveResult:
    queue.submit(plans)
    assert queue.drain(30.0)
    return results[-1]


def _load(kv: HostKV | DeviceKV, checker: Checker, link: SidecarLink, job: LoadJob) -> list[bool]:
    if isinstance(kv, HostKV):
        DirectLoad(kv, checker, link).run(job)
        return job.confirm()
    load = LayerwiseLoad(kv, checker, link, job, 10.0)
    load.start()
    for i in range(len(kv.layout.layers)):
        load.wait_layer(i)
    ok = load.finish()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    load.release()
    return ok


@pytest.mark.parametrize("name", ["LBHNC", "LBNHC", "kv-first"])
def test_save_then_load_through_the_sidecar(link: SidecarLink, name: str) -> None:
    src = KVLayout(caches(name, 0), NB)
    dst = KVLayout(caches(name, 1), NB)
    digest = layout_digest("ns", src.signature)
    results: list[SaveResult] = []
    queue = SaveQueue(kv_for(src), link, "ns", digest, lambda job, r: results.append(r))
    hashes = [os.urandom(32) for _ in range(6)]
    first = _save(queue, results, [_plan(hashes[:4], [1, 2, 3, 4]),
                                   _plan(hashes[4:], [7, 8], req="r2")])
    assert first.saved == {"r1": 4, "r2": 2} and not first.failed
    assert first.nbytes == 6 * (HEADER_SIZE + src.block_bytes)
    checker = Checker(digest, src.block_bytes)
    job = LoadJob("ns", hashes, [0, 3, 5, 6, 9, 10])
    assert _load(kv_for(dst), checker, link, job) == [True] * 6
    assert torch.equal(dst.gather([0, 3, 5, 6, 9, 10]), src.gather([1, 2, 3, 4, 7, 8]))
    # A block the sidecar does not hold fails; so does one of another layout.
    other = Checker(layout_digest("ns", "another layout"), src.block_bytes)
    missing = LoadJob("ns", [hashes[0], os.urandom(32)], [0, 3])
    assert _load(kv_for(dst), checker, link, missing) == [True, False]
    foreign = LoadJob("ns", hashes[:2], [0, 3])
    assert _load(kv_for(dst), other, link, foreign) == [False, False]
    queue.close()
    checker.close()
    other.close()


@pytest.mark.parametrize("at", [HEADER_SIZE + 5, 20], ids=["body", "reserved-header-byte"])
def test_corrupted_payload_is_refused(server_factory: Any, at: int) -> None:
    # DRAM only: with a disk tier the write-back may land an intact copy before the flip,
    # and the sidecar would (rightly) serve that one.
    server = server_factory(disk={"enabled": False})
    link = SidecarLink(server.address, 5.0, 1.0)
    layout = KVLayout(caches("LBHNC", 0), NB)
    digest = layout_digest("ns", layout.signature)
    results: list[SaveResult] = []
    queue = SaveQueue(kv_for(layout), link, "ns", digest, lambda job, r: results.append(r))
    hashes = [os.urandom(32) for _ in range(3)]
    _save(queue, results, [_plan(hashes, [1, 2, 3])])
    # Flip one byte of the middle block where the sidecar keeps it (unchecked, so the
    # sidecar learns of it only from the connector's load).
    from kvstore.client import KVStoreClient

    with KVStoreClient(server.address) as client:
        def flip(batch: Any) -> None:
            for _, slot in batch:
                slot.buffer[slot.offset + at] ^= 0xFF

        client.get_in_place("ns", [hashes[1]], flip, verify=False)
        checker = Checker(digest, layout.block_bytes)
        job = LoadJob("ns", hashes, [4, 5, 6])
        assert _load(kv_for(layout), checker, link, job) == [True, False, True]
        assert torch.equal(layout.gather([4, 6]), layout.gather([1, 3]))
        # The load reported the corrupt copy: the sidecar dropped it.
        assert client.lookup("ns", hashes[1:2]).num_hit == 0
        assert client.lookup("ns", hashes[2:3]).num_hit == 1
    queue.close()
    checker.close()
    link.close()


def test_one_hash_pass_per_saved_and_per_loaded_byte(server_factory: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Every xxh3 pass over block bytes, in the connector, the client and the sidecar
    (in process here), counted: a save hashes each slot once (the client, for the
    commit), a load once (the connector, against the sidecar's record)."""
    import xxhash

    server = server_factory(disk={"enabled": False})
    link = SidecarLink(server.address, 5.0, 1.0)
    layout = KVLayout(caches("LBHNC", 0), NB)
    digest = layout_digest("ns", layout.signature)
    hashed: list[int] = []
    real = xxhash.xxh3_64_intdigest

    def counting(data: Any, *args: Any) -> int:
        n = memoryview(data).nbytes
        if n >= 1024:  # block bytes, not the digests of short keys
            hashed.append(n)
        return real(data, *args)

    class Counting:
        """xxh3-64 fed in pieces (a load hashes each row it copies)."""

        def __init__(self, data: Any = b"") -> None:
            self._h = real_stream()
            self._n = 0
            self.update(data)

        def update(self, data: Any) -> None:
            self._n += memoryview(data).nbytes
            self._h.update(data)

        def intdigest(self) -> int:
            if self._n >= 1024:
                hashed.append(self._n)
            return int(self._h.intdigest())

    real_stream = xxhash.xxh3_64
    monkeypatch.setattr(xxhash, "xxh3_64_intdigest", counting)
    monkeypatch.setattr(xxhash, "xxh3_64", Counting)
    results: list[SaveResult] = []
    queue = SaveQueue(kv_for(layout), link, "ns", digest, lambda job, r: results.append(r))
    hashes = [os.urandom(32) for _ in range(6)]
    slot = HEADER_SIZE + layout.block_bytes
    assert _save(queue, results, [_plan(hashes, [1, 2, 3, 4, 5, 6])]).saved == {"r1": 6}
    assert sum(hashed) == 6 * slot, hashed
    hashed.clear()
    checker = Checker(digest, layout.block_bytes)
    job = LoadJob("ns", hashes, [7, 8, 9, 10, 11, 0])
    assert _load(kv_for(layout), checker, link, job) == [True] * 6
    assert torch.equal(layout.gather([7, 8, 9, 10, 11, 0]), layout.gather([1, 2, 3, 4, 5, 6]))
    assert sum(hashed) == 6 * slot, hashed
    queue.close()
    checker.close()
    link.close()


def test_saves_run_off_the_caller_and_report_busy_requests(link: SidecarLink) -> None:
    layout = KVLayout(caches("LBHNC"), NB)
    digest = layout_digest("ns", layout.signature)
    gate = threading.Event()
    entered = threading.Event()
    done: list[tuple[SaveJob, SaveResult]] = []

    def on_done(job: SaveJob, result: SaveResult) -> None:
        entered.set()
        gate.wait(10.0)
        done.append((job, result))

    queue = SaveQueue(kv_for(layout), link, "ns", digest, on_done)
    queue.submit([_plan([os.urandom(32)], [1], req="a")])
    queue.submit([_plan([os.urandom(32)], [2], req="b")])
    assert queue.busy("a") and queue.busy("b") and not queue.busy("c")
    # a's job is the running one once its callback holds the worker (not before: under
    # load the worker may not have picked it up yet, and a queued a would be dropped too).
    assert entered.wait(10.0)
    # b's queued save is dropped when b is preempted; a's running job is waited for.
    threading.Timer(0.2, gate.set).start()
    started = time.monotonic()
    queue.preempted({"a", "b"})
    assert time.monotonic() - started < 5.0
    assert queue.drain(10.0)
    assert not queue.busy("a") and not queue.busy("b")
    by_req = {next(iter(job.req_ids)): result for job, result in done}
    assert by_req["a"].saved == {"a": 1}
    assert by_req["b"].failed == {"b": 1} and not by_req["b"].saved
    queue.close()


def test_saves_and_loads_fail_fast_when_the_sidecar_is_down() -> None:
    layout = KVLayout(caches("LBHNC"), NB)
    digest = layout_digest("ns", layout.signature)
    link = SidecarLink("127.0.0.1:1", 1.0, 60.0)
    results: list[SaveResult] = []
    queue = SaveQueue(kv_for(layout), link, "ns", digest, lambda job, r: results.append(r))
    started = time.monotonic()
    result = _save(queue, results, [_plan([os.urandom(32)] * 2, [1, 2])])
    assert result.failed == {"r1": 2} and not link.is_up
    checker = Checker(digest, layout.block_bytes)
    job = LoadJob("ns", [os.urandom(32)], [3])
    assert _load(kv_for(layout), checker, link, job) == [False]
    assert time.monotonic() - started < 5.0
    queue.close()
    checker.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs Linux CPU affinity and two CPUs")
def test_connector_threads_leave_the_starting_threads_core() -> None:
    """vLLM's CPU worker pins its main thread to one core; the connector's threads
    must not inherit it (they would share that core with the model)."""
    from kvstore.connectors.vllm import threads

    seen: dict[str, set[int]] = {}

    def pinned_parent() -> None:
        os.sched_setaffinity(0, {0})
        done = threading.Event()

        def child() -> None:
            seen["thread"] = os.sched_getaffinity(0)
            done.set()

        threads.start(child, "t")
        done.wait(5.0)
        with threads.pool(1, "p") as pool:
            seen["pool"] = pool.submit(lambda: os.sched_getaffinity(0)).result()
        seen["parent"] = os.sched_getaffinity(0)

    parent = threading.Thread(target=pinned_parent)
    parent.start()
    parent.join(10.0)
    assert seen["parent"] == {0}
    assert len(seen["thread"]) > 1 and len(seen["pool"]) > 1
