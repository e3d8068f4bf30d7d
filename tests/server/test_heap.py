"""``kvstore serve`` keeps the cyclic collector from walking the whole index on the event
loop: the heap is frozen as it ages (``kvstore.server.heap``)."""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.client._common import put_requests
from kvstore.config import load_config
from kvstore.errors import ConfigError
from kvstore.server.app import KVStoreServer
from kvstore.server.heap import freeze_survivors, keep_frozen
from kvstore.tools.bench_loop import _Context, served_config
from kvstore.tools.measure import make_blocks


@pytest.fixture
def thawed() -> Iterator[None]:
    """The collector as this process had it (other tests run in it)."""
    frozen = gc.get_freeze_count()
    yield
    if not frozen:
        gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.other: Any = None


def _walked(obj: object) -> bool:
    """Whether a collection of every generation would walk ``obj``."""
    return any(o is obj for o in gc.get_objects())


def test_a_freeze_collects_the_garbage_first_and_freezes_what_survives(thawed: None) -> None:
    live = _Node()
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle, and garbage once its names go
    gone = weakref.ref(a)
    del a, b
    assert freeze_survivors() >= 2  # the cycle was found and freed, not frozen
    assert gone() is None
    assert not _walked(live) and gc.is_tracked(live)  # frozen: no collection walks it
    fresh = _Node()
    assert _walked(fresh)  # what is made after a freeze is collected as usual


async def test_with_the_keeper_no_collection_walks_the_stored_blocks(thawed: None,
                                                                      tmp_path: Any) -> None:
    """Blocks stored while the keeper runs leave the collector's generations within an
    interval: a full collection walks a fraction of them (without it, every one of the
    dozen objects each stored block keeps)."""
    srv = KVStoreServer(served_config(str(tmp_path), dram_only=True))
    await srv.start()
    assert srv.servicer is not None
    walked: dict[str, int] = {}
    try:
        for keeper_on in (False, True):
            freeze_survivors()
            keeper = asyncio.create_task(keep_frozen(0.05)) if keeper_on else None
            for c in range(4):
                msgs = list(put_requests(f"heap-{keeper_on}-{c}",
                                         make_blocks(500, 256, seed=10 * c + keeper_on), {}))

                async def stream(m: list[pb.PutRequest] = msgs) -> Any:
                    for msg in m:
                        yield msg

                assert (await srv.servicer.Put(stream(), _Context())).stored == 500
            await asyncio.sleep(0.2)  # (the keeper's intervals pass)
            if keeper is not None:
                keeper.cancel()
            walked["on" if keeper_on else "off"] = len(gc.get_objects())
    finally:
        await srv.stop(0)
    assert walked["off"] > 2 * 2000  # each of the 2,000 blocks keeps tracked objects
    assert walked["on"] < 2000 // 4


#: A client in its own process (its objects stay out of the server's heap): puts, lookups,
#: gets, hints and deletes, a failed call, a call past its deadline and a Put stream it
#: cancels halfway, ``rounds`` times.
_CLIENT = """
import sys, time
import grpc
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb, kvstore_pb2_grpc as pbg
from kvstore.client import KVStoreClient
from kvstore.client._common import put_requests
from kvstore.tools.measure import make_blocks

address, rounds = sys.argv[1], int(sys.argv[2])
stub = pbg.KVStoreStub(grpc.insecure_channel(address))
with KVStoreClient(address) as c:
    for r in range(rounds):
        ns, sid = f"ns{r % 3}", f"s{r % 5}"
        blocks = make_blocks(8, 4096, seed=r)
        hashes = [b.block_hash for b in blocks]
        c.put(ns, blocks, session_id=sid, request_id=f"put-{r}")
        c.lookup(ns, hashes, sid, "agent", request_id=f"lookup-{r}")
        c.get(ns, hashes[:4])
        c.hint(sid, "tool_call", workload="agent", tool="grep", namespace=ns)
        try:
            stub.Lookup(pb.LookupRequest(namespace=ns, block_hashes=[b"short"]))
        except grpc.RpcError:
            pass
        try:
            stub.Lookup(pb.LookupRequest(namespace=ns, block_hashes=hashes), timeout=1e-4)
        except grpc.RpcError:
            pass

        def stream(r=r):
            for msg in put_requests(f"cut{r}", make_blocks(4, 4096, seed=1000 + r), {}):
                yield msg
                time.sleep(0.01)

        call = stub.Put.future(stream())
        time.sleep(0.005)
        call.cancel()
        if r % 4 == 3:
            c.delete(ns)
"""


async def test_a_frozen_heap_keeps_no_garbage_a_client_can_make(thawed: None,
                                                                 tmp_path: Any) -> None:
    """The freezes' price is any reference cycle through a frozen object: never collected.
    With the heap frozen every 20 ms (calls in flight frozen with it), a client's puts,
    lookups, gets, hints, deletes, failed calls, calls past their deadline and Put streams
    it cancels leave none: thawed, a full collection finds nothing to free. (Answering a
    failed call with ``context.abort`` left ~50 objects per call in flight at a freeze.)"""
    gc.collect()
    gc.unfreeze()
    srv = KVStoreServer(served_config(str(tmp_path)))
    await srv.start()
    freeze_survivors()
    keeper = asyncio.create_task(keep_frozen(0.02))
    try:
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CLIENT, f"127.0.0.1:{srv.port}", "40",
            stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(client.communicate(), 120)
        assert client.returncode == 0, err.decode()[-2000:]
    finally:
        keeper.cancel()
        await srv.stop(0)
    gc.collect()  # what was never frozen
    gc.unfreeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        found = gc.collect()
        kinds = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert found == 0, kinds.most_common(12)


async def test_the_keeper_takes_a_positive_interval() -> None:
    with pytest.raises(ValueError, match="every_s"):
        await keep_frozen(0)


def test_gil_switch_s_is_checked() -> None:
    assert load_config(env={}).server.gil_switch_s == 0.0005
    for bad in (0, -1, float("nan"), 2):
        with pytest.raises(ConfigError, match="server.gil_switch_s"):
            load_config(env={}, overrides={"server": {"gil_switch_s": bad}})


def test_gc_freeze_s_is_checked() -> None:
    assert load_config(env={}, overrides={"server": {"gc_freeze_s": 0}}).server.gc_freeze_s == 0
    for bad in (-1, float("nan"), 7200):
        with pytest.raises(ConfigError, match="server.gc_freeze_s"):
            load_config(env={}, overrides={"server": {"gc_freeze_s": bad}})


async def test_a_failed_call_is_answered_without_raising_through_grpc(tmp_path: Any) -> None:
    """A KVStoreError becomes the call's status, details and ``kvstore-error`` trailer,
    set on the context; the handler returns. (``context.abort`` raised an exception that
    the call's state and its traceback hold in a cycle: each failed call in flight at a
    freeze leaked it.)"""

    class Recording(_Context):
        def __init__(self) -> None:
            self.said: dict[str, Any] = {}

        def set_trailing_metadata(self, md: Any) -> None:
            self.said["trailer"] = md

        def set_code(self, code: Any) -> None:
            self.said["code"] = code

        def set_details(self, details: str) -> None:
            self.said["details"] = details

        async def abort(self, code: Any, details: str) -> None:
            raise AssertionError("aborted")

    srv = KVStoreServer(served_config(str(tmp_path), dram_only=True))
    await srv.start()
    assert srv.servicer is not None
    ctx = Recording()
    try:
        answer = await srv.servicer.Lookup(
            pb.LookupRequest(namespace="n", block_hashes=[b"short"]), ctx)
    finally:
        await srv.stop(0)
    assert answer is None
    assert ctx.said["code"] == grpc.StatusCode.INVALID_ARGUMENT
    assert "32 bytes" in ctx.said["details"], ctx.said["details"]
    assert ctx.said["trailer"] == (("kvstore-error", "InvalidBlock"),)
