"""Across hosts: two ``kvstore serve`` processes (two data dirs) and one Redis. A prefix
stored through A is found by B's Lookup, loaded and verified; both publish the blocks as
``STORAGE`` + ``REMOTE`` (vLLM 0.33's vocabulary, the default) in vLLM's event format,
decoded by ours and by vLLM's own classes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kvstore import KVStoreClient, Medium
from kvstore.events import wire
from kvstore.hashing import block_hash_to_int
from kvstore.tools.harness import LocalServer
from tests.blocks import make_chain
from tests.events.conftest import run_golden
from tests.redis_servers import delete_prefix

from .redis_helpers import event_payloads, stored, tier_blocks, wait_for

pytestmark = pytest.mark.slow

NS = "qwen|bf16|tp0/1"
KiB = 2**10


@dataclass
class Run:
    blocks: list[Any]
    lookup: Any
    got: list[Any]
    relookup: Any
    payloads: dict[str, list[bytes]]

    @property
    def ints(self) -> set[int]:
        return {block_hash_to_int(b.block_hash) for b in self.blocks}


@pytest.fixture(scope="module")
def run(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    prefix = f"kvtest-{uuid.uuid4().hex[:12]}"
    env = {"KVSTORE_REDIS__ENABLED": "true", "KVSTORE_REDIS__URL": redis_url,
           "KVSTORE_REDIS__KEY_PREFIX": prefix, "KVSTORE_DRAM__CAPACITY": "64MiB",
           "KVSTORE_DISK__CAPACITY": "256MiB"}
    base = tmp_path_factory.mktemp("hosts")
    procs = [LocalServer(base / name / "data", env=env) for name in ("a", "b")]
    try:
        for p in procs:
            p.start()
        a, b = procs
        blocks = make_chain(4, 512 * KiB, seed=21)
        hashes = [x.block_hash for x in blocks]
        with KVStoreClient(a.address) as ca:
            ca.put(NS, blocks)
        wait_for(lambda: tier_blocks(a.address, "redis") == 4, what="A's write-through")
        with KVStoreClient(b.address) as cb:
            lookup = cb.lookup(NS, hashes)
            got = cb.get(NS, hashes)
            relookup = cb.lookup(NS, hashes)
        ints = {block_hash_to_int(h) for h in hashes}

        def has(medium: str) -> Any:
            return lambda evs: stored(evs, medium) >= ints

        payloads = {
            "a": event_payloads(a.address, has("REMOTE")),
            "b": event_payloads(b.address, lambda evs: has("REMOTE")(evs) and has("CPU")(evs)),
        }
        yield Run(blocks, lookup, got, relookup, payloads)
    finally:
        for p in procs:
            p.stop()
        delete_prefix([int(redis_url.rsplit(":", 1)[1].split("/")[0])], prefix)


def test_b_finds_loads_and_verifies_what_a_stored(run: Run) -> None:
    assert run.lookup.num_hit == 4 and set(run.lookup.media) == {Medium.REMOTE}
    assert [g.payload if g else None for g in run.got] == [b.payload for b in run.blocks]
    assert [list(g.token_ids) for g in run.got] == [list(b.token_ids) for b in run.blocks]
    assert run.relookup.num_hit == 4 and set(run.relookup.media) == {Medium.CPU}


def test_both_publish_the_blocks_as_remote(run: Run) -> None:
    for host in ("a", "b"):
        events = [e for p in run.payloads[host] for e in wire.decode_batch(p).events]
        remote = [e for e in events if isinstance(e, wire.BlockStored)
                  and (e.medium, e.locality, e.ownership) == ("STORAGE", "REMOTE", "redis")]
        assert {h for e in remote for h in e.block_hashes} >= run.ints
        by_hash = {e.block_hashes[0]: e for e in remote if len(e.block_hashes) == 1}
        first = by_hash.get(block_hash_to_int(run.blocks[1].block_hash))
        if first is not None:  # announced one by one: token ids and parent ride along
            assert first.token_ids == list(run.blocks[1].token_ids)
            assert first.parent_block_hash == block_hash_to_int(run.blocks[0].block_hash)


@pytest.mark.vllm
def test_remote_events_decode_with_vllms_own_classes(run: Run, vllm_python: str) -> None:
    decode = [{"name": f"{host}{i}", "encoding": "map", "payload_hex": p.hex()}
              for host, ps in run.payloads.items() for i, p in enumerate(ps)]
    out = run_golden(vllm_python, {"decode": decode})
    assert not out["errors"], out["errors"]
    for host in ("a", "b"):
        events = [e for name, d in out["decoded"].items() if name.startswith(host)
                  for e in d["events"]]
        remote = {h for e in events if _remote(e) for h in e["block_hashes"]}
        assert remote >= run.ints
        tokens = [t for e in events if _remote(e) for t in e["token_ids"]]
        assert set(tokens) <= {t for b in run.blocks for t in b.token_ids}


def _remote(event: dict[str, Any]) -> bool:
    """A BlockStored on Redis as vLLM's classes decoded it (its locality is vLLM's own
    field: 0.32 decodes it already)."""
    return (event["type"] == "BlockStored" and event["medium"] == "STORAGE"
            and event.get("locality") == "REMOTE")
