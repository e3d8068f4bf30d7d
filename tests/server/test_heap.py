"""``kvstore serve`` keeps the cyclic collector from walking the whole index on the event
loop: the heap is frozen as it ages (``kvstore.server.heap``)."""

from __future__ import annotations

import asyncio
import gc
import weakref
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


async def test_the_keeper_takes_a_positive_interval() -> None:
    with pytest.raises(ValueError, match="every_s"):
        await keep_frozen(0)


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
