"""Chunks stored through LMCache show up in the sidecar's KV event stream, as vLLM's
``BlockStored`` with LMCache's own chunk hashes (64-bit ints), decodable by our decoder
and by vLLM's own msgspec classes (in the vLLM venv, skipped without it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from kvstore.events import wire
from tests.conftest import ServerThread, test_config
from tests.events.conftest import run_golden

from .conftest import Driver

pytestmark = pytest.mark.slow


def _replay(endpoint: str) -> list[bytes]:
    """Every batch the publisher still buffers, raw, from its replay socket."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart((b"", (0).to_bytes(8, "big")))
        payloads = []
        while sock.poll(5000):
            _, _, seq, payload = sock.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) < 0:
                return payloads
            payloads.append(payload)
        raise AssertionError(f"no end of replay from {endpoint}")
    finally:
        sock.close(0)


def _stored_events(payloads: list[bytes], medium: str) -> list[wire.BlockStored]:
    return [e for p in payloads for e in wire.decode_batch(p).events
            if isinstance(e, wire.BlockStored) and e.medium == medium]


def _stored(payloads: list[bytes], medium: str) -> set[int]:
    return {h for e in _stored_events(payloads, medium) for h in e.block_hashes
            if isinstance(h, int)}


@pytest.fixture(scope="module")
def stored_through_lmcache(lmcache_python: str, tmp_path_factory: Any
                           ) -> Iterator[tuple[list[bytes], list[int]]]:
    """One LMCache engine stores one prompt through the plugin: the sidecar's event
    batches (raw) and the chunk hashes LMCache gave the prompt's chunks."""
    tmp: Path = tmp_path_factory.mktemp("lmcache-events")
    server = ServerThread(test_config(tmp / "data"))
    driver = Driver(lmcache_python, tmp / "driver.log")
    try:
        driver.call("engine", name="a", address=server.address)
        out = driver.call("store", name="a", prompt=5, kv_seed=55)
        assert out["flushed"]
        want = set(out["chunk_hashes"])
        endpoint = server.server.events.publishers[0].replay_endpoint
        deadline = time.monotonic() + 15
        while True:
            payloads = _replay(endpoint)
            if want <= _stored(payloads, "CPU") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        yield payloads, out["chunk_hashes"]
    finally:
        driver.close()
        server.stop()


def test_events_carry_lmcache_chunk_hashes(stored_through_lmcache: Any) -> None:
    payloads, chunk_hashes = stored_through_lmcache
    assert len(chunk_hashes) == 4
    assert _stored(payloads, "CPU") == set(chunk_hashes)  # the shared-memory tier
    # LMCache hands remote backends no tokens and no chain: the events say so plainly.
    for event in _stored_events(payloads, "CPU"):
        assert event.token_ids == [] and event.block_size == 0
        assert event.parent_block_hash is None


def test_events_decode_with_vllm_classes(stored_through_lmcache: Any, vllm_python: str) -> None:
    payloads, chunk_hashes = stored_through_lmcache
    decode = [{"name": f"b{i}", "encoding": "map", "payload_hex": p.hex()}
              for i, p in enumerate(payloads)]
    got = run_golden(vllm_python, {"decode": decode})
    assert not got["errors"], got["errors"]
    stored = {h for name in got["decoded"] for e in got["decoded"][name]["events"]
              if e["type"] == "BlockStored" and e["medium"] == "CPU" for h in e["block_hashes"]}
    assert stored == set(chunk_hashes)
