"""A real server's placement events, through ZMQ, into the router's index:
what the router sees per medium equals where the server says each block is."""

from __future__ import annotations

import asyncio
import time

from kvstore.connectors.router import PodSubscriber, PrefixIndex, PrefixScorer

from kvstore import KVStoreClient, Medium
from kvstore.hashing import block_hash_to_int
from tests.blocks import make_chain

MiB = 2**20


def _router_view(index: PrefixIndex) -> dict[str, set[int]]:
    return {m: index.blocks("pod-a", m) for m in ("cpu", "disk")}


def _server_view(srv) -> dict[str, set[int]]:
    """Where the server holds each block, read from its index on its own loop (a
    Lookup would prefetch and so change what it observes)."""

    async def snapshot() -> dict[str, set[int]]:
        view: dict[str, set[int]] = {"cpu": set(), "disk": set()}
        for e in srv.engine.index.entries():
            for tier in e.tiers:
                medium = srv.engine.tiers[tier].medium.value.lower()
                view[medium].add(block_hash_to_int(e.key.block_hash))
        return view

    return srv.run(snapshot())


async def test_router_index_follows_the_servers_placement(server_factory):
    # lru: every block enters DRAM and is written back (the placement this test follows).
    srv = server_factory(dram={"capacity": "4MiB"}, disk={"capacity": "64MiB"},
                         engine={"policy": "lru"})
    pub = srv.server.events.publishers[0]
    index = PrefixIndex()
    sub = PodSubscriber("pod-a", pub.endpoint, index, replay_endpoint=pub.replay_endpoint,
                        topic=pub.config.effective_topic, start_seq=0)
    await sub.start()
    try:
        blocks = make_chain(10, MiB, seed=11)  # 10 MiB through a 4 MiB DRAM tier
        hashes = [b.block_hash for b in blocks]
        with KVStoreClient(srv.address) as c:
            await asyncio.to_thread(c.put, "m", blocks)
            await asyncio.to_thread(srv.drain)
            st = await asyncio.to_thread(c.stats)
            assert st.tier("dram").blocks == 4 and st.tier("disk").blocks == 10

            every = {block_hash_to_int(h) for h in hashes}
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _router_view(index)["disk"] != every:
                await asyncio.sleep(0.05)
            view = _router_view(index)
            assert view["disk"] == every  # write-back announced every block on DISK
            assert view == await asyncio.to_thread(_server_view, srv)
            assert len(view["cpu"]) == 4

            # The router's scorer prefers this pod for the chain, weighted by tier.
            scorer = PrefixScorer(index)
            ints = [block_hash_to_int(h) for h in hashes]
            assert scorer.prefix_blocks(ints, "pod-a") == 10
            best, score = scorer.best(ints, ["pod-a", "pod-b"])
            assert best == "pod-a" and score > 0

            # Deleting the namespace clears it for the router too.
            await asyncio.to_thread(c.delete, "m")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and index.blocks("pod-a"):
                await asyncio.sleep(0.05)
            assert index.blocks("pod-a") == set()
            assert st.tier("dram").medium is Medium.CPU
    finally:
        await sub.close()
