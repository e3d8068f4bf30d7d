"""The connector's worker side as vLLM drives it, without vLLM, against a real sidecar.

Steps are played the way vLLM's model runner plays them: ``start_load_kv``,
``wait_for_layer_load`` per attention layer, ``wait_for_save``, then
``get_finished`` / ``get_block_ids_with_load_errors`` / the worker report.
Both paths run on host tensors (the staged layer-wise one forced); on
``KVSTORE_TEST_DEVICE=cuda`` (``scripts/gpu_check.sh``) the staged path runs on
CUDA tensors.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kvstore.connectors.vllm.metadata import KVStoreConnectorMetadata  # noqa: E402
from kvstore.connectors.vllm.plans import BlockSave, LoadPlan, SavePlan  # noqa: E402
from kvstore.connectors.vllm.sidecar import SidecarLink  # noqa: E402
from kvstore.connectors.vllm.worker import WorkerSide  # noqa: E402

from kvstore.client import SlotBuffer  # noqa: E402
from tests.vllm.kv_layouts import make_kv_caches  # noqa: E402

DEVICE = torch.device(os.environ.get("KVSTORE_TEST_DEVICE", "cpu"))
NB = 16
BS = 32
PATHS = ["staged"] if DEVICE.type == "cuda" else ["direct", "staged"]


def worker(link: SidecarLink, path: str, seed: int) -> tuple[WorkerSide, dict[str, Any]]:
    side = WorkerSide(link, "ns", NB, BS, timeout_s=5.0, host_threads=2,
                      staged=path == "staged")
    caches = make_kv_caches("LBNHC", num_blocks=NB, seed=seed, device=DEVICE,
                            dtype=torch.bfloat16 if DEVICE.type == "cuda" else torch.float32)
    side.register_kv_caches(caches)
    return side, caches


def step(side: WorkerSide, meta: KVStoreConnectorMetadata) -> tuple[set[int], Any]:
    """One engine step: loads before the forward, every layer waits, saves after."""
    side.start_load_kv(meta)
    assert side.layout is not None
    for name in side.layout.index:
        side.wait_for_layer_load(name)
    side.wait_for_save(meta)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    return side.take_load_errors(), side.take_report()


def save_plan(req: str, hashes: list[bytes], ids: list[int]) -> SavePlan:
    blocks = tuple(
        BlockSave(h, hashes[i - 1] if i else None, tuple(range(i, i + BS)), b)
        for i, (h, b) in enumerate(zip(hashes, ids, strict=True))
    )
    return SavePlan(req, "s1", "chat", blocks)


@pytest.fixture
def link(server: Any) -> Iterator[SidecarLink]:
    link = SidecarLink(server.address, 5.0, 1.0)
    yield link
    link.close()


@pytest.mark.parametrize("path", PATHS)
def test_saved_blocks_load_into_another_engine(link: SidecarLink, path: str) -> None:
    a, a_kv = worker(link, path, seed=0)
    b, b_kv = worker(SidecarLink(link.address, 5.0, 1.0), path, seed=1)
    hashes = [os.urandom(32) for _ in range(5)]
    errors, _ = step(a, KVStoreConnectorMetadata(saves=[save_plan("w", hashes, [1, 2, 3, 4, 5])]))
    assert not errors
    assert a._saves is not None and a._saves.drain(10.0)
    report = a.take_report()
    assert report is not None and report.saved == {"w": 5} and report.save_bytes > 0
    # Engine b loads them into other blocks; request r2's second hash is unknown,
    # so r2 keeps only its first block and recomputes from the second.
    loads = [
        LoadPlan("r1", tuple(hashes[:3]), (9, 10, 11)),
        LoadPlan("r2", (hashes[3], os.urandom(32), hashes[4]), (12, 13, 14)),
    ]
    errors, report = step(b, KVStoreConnectorMetadata(loads=loads))
    assert errors == {13, 14}
    assert report.loaded == {"r1": 3, "r2": 1} and report.load_failed == {"r2": 2}
    assert report.load_ms["r1"] > 0
    for name, t in a_kv.items():
        assert torch.equal(b_kv[name][[9, 10, 11, 12]], t[[1, 2, 3, 4]]), name
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize("path", PATHS)
def test_a_stalled_sidecar_fails_the_load_within_its_deadline(path: str) -> None:
    """A sidecar that accepts and never answers. The direct path fails at the call's
    deadline; the staged one gives up on the load at the step's deadline even while
    its call is still waiting (a late load), and the blocks are recomputed."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        call_s = 0.5 if path == "direct" else 3.0
        side = WorkerSide(SidecarLink(address, call_s, 60.0), "ns", NB, BS, timeout_s=0.3,
                          host_threads=2, staged=path == "staged")
        side.register_kv_caches(make_kv_caches("LBNHC", num_blocks=NB, device=DEVICE))
        started = time.monotonic()
        errors, report = step(side, KVStoreConnectorMetadata(
            loads=[LoadPlan("r", (os.urandom(32),) * 2, (3, 4))]))
        assert errors == {3, 4} and report.load_failed == {"r": 2}
        assert time.monotonic() - started < 2.0
        side.shutdown()


def test_finished_requests_wait_for_their_saves_and_holds() -> None:
    gate = threading.Event()
    written: list[int] = []

    class SlowSidecar:
        def put_in_place(self, ns: str, specs: Any, fill: Any, **kw: Any) -> int:
            gate.wait(10.0)
            seg = memoryview(bytearray(sum(b.size for b in specs)))
            fill([(i, SlotBuffer(seg, i * b.size, b.size)) for i, b in enumerate(specs)])
            written.extend(range(len(specs)))
            return len(specs)

        def close(self) -> None:
            pass

    link = SidecarLink("127.0.0.1:1", 1.0, 60.0, client_factory=lambda a, t: SlowSidecar())
    side = WorkerSide(link, "ns", NB, BS, timeout_s=1.0)
    side.register_kv_caches(make_kv_caches("LBHNC", num_blocks=NB))
    started = time.monotonic()
    step(side, KVStoreConnectorMetadata(saves=[save_plan("r", [b"h" * 32], [3])]))
    assert not written and time.monotonic() - started < 1.0  # queued, not waited for
    # The request finished; its id arrives with a 50 ms hold, in an idle step.
    side.start_load_kv(KVStoreConnectorMetadata(holds={"r": 0.05}, idle=True))
    assert side.get_finished({"r"}, idle=True) == (None, None)  # its save is still pending
    gate.set()
    deadline = time.monotonic() + 5.0
    done = None
    while done is None and time.monotonic() < deadline:
        done, _ = side.get_finished(set(), idle=True)
    assert done == {"r"} and written == [0]
    report = side.take_report()
    assert report is not None and report.saved == {"r": 1} and report.save_bytes > 0
    assert side.get_finished(set()) == (None, None)  # reported once
    side.shutdown()


def _received(side: WorkerSide, timeout_s: float) -> tuple[set[str], set[int], Any]:
    """Idle steps (no forward) until get_finished reports receives."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        side.start_load_kv(KVStoreConnectorMetadata(idle=True))
        _, received = side.get_finished(set(), idle=True)
        if received:
            return received, side.take_load_errors(), side.take_report()
    raise AssertionError("no receive reported")


@pytest.mark.parametrize("path", PATHS)
def test_asynchronous_loads_are_reported_received_when_in_place(link: SidecarLink,
                                                                 path: str) -> None:
    """``start_load_kv`` returns before the blocks are copied; ``get_finished`` reports
    each request among its receives once they are, failed blocks first."""
    a, a_kv = worker(link, path, seed=0)
    b, b_kv = worker(SidecarLink(link.address, 5.0, 1.0), path, seed=1)
    hashes = [os.urandom(32) for _ in range(4)]
    step(a, KVStoreConnectorMetadata(saves=[save_plan("w", hashes, [1, 2, 3, 4])]))
    assert a._saves is not None and a._saves.drain(10.0)
    loads = [LoadPlan("r1", tuple(hashes[:2]), (9, 10), asynchronous=True),
             LoadPlan("r2", (hashes[2], os.urandom(32)), (11, 12), asynchronous=True)]
    errors, _ = step(b, KVStoreConnectorMetadata(loads=loads))
    assert not errors  # nothing settled inside the step
    received, errors, report = _received(b, 10.0)
    assert received == {"r1", "r2"} and errors == {12}
    assert report.loaded == {"r1": 2, "r2": 1} and report.load_failed == {"r2": 1}
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    for name, t in a_kv.items():
        assert torch.equal(b_kv[name][[9, 10, 11]], t[[1, 2, 3]]), name
    assert b.get_finished(set()) == (None, None)  # reported once
    a.shutdown()
    b.shutdown()


def test_a_late_asynchronous_load_is_given_up_and_copies_nothing(link: SidecarLink) -> None:
    """A load still waiting for the sidecar at ``timeout_s``: its request is reported
    received with every block failed (recomputed), and when the sidecar answers later
    nothing is copied into the blocks the engine recomputes meanwhile."""
    a, a_kv = worker(link, "direct", seed=0)
    hashes = [os.urandom(32) for _ in range(2)]
    step(a, KVStoreConnectorMetadata(saves=[save_plan("w", hashes, [1, 2])]))
    assert a._saves is not None and a._saves.drain(10.0)
    gate = threading.Event()

    class SlowRead(SidecarLink):
        def call(self, op: str, fn: Any, default: Any) -> Any:
            if op == "get":
                gate.wait(10.0)
            return super().call(op, fn, default)

    b = WorkerSide(SlowRead(link.address, 5.0, 1.0), "ns", NB, BS, timeout_s=0.3,
                   host_threads=2, staged=False)
    b_kv = make_kv_caches("LBNHC", num_blocks=NB, seed=1, device=DEVICE)
    b.register_kv_caches(b_kv)
    before = {name: t[[9, 10]].clone() for name, t in b_kv.items()}
    started = time.monotonic()
    step(b, KVStoreConnectorMetadata(loads=[LoadPlan("r", tuple(hashes), (9, 10),
                                                     asynchronous=True)]))
    assert time.monotonic() - started < 0.2  # not waited for in the step
    received, errors, report = _received(b, 5.0)
    assert received == {"r"} and errors == {9, 10} and report.load_failed == {"r": 2}
    assert 0.3 <= time.monotonic() - started < 2.0
    gate.set()  # the sidecar answers now: the given-up load must not write
    time.sleep(0.5)
    for name, t in b_kv.items():
        assert torch.equal(t[[9, 10]], before[name]), name
    a.shutdown()
    b.shutdown()
