"""Event stream benchmark: ``kvstore bench-events``.

1. Throughput: block events per second through the bus and the ZMQ PUB socket
   (``BlockMeta`` in, msgpack batches on the wire), received and counted by a
   SUB socket in another process, for both encodings and three shapes:
   ``separate`` (every block its own prefix, so one BlockStored per block: the
   worst case), ``chained`` one block per sink call (calls merge into one
   BlockStored per run) and ``chained`` 16 blocks per call.
2. Latency: publish-to-index p50/p99, from the bus's flush (the batch ``ts``)
   to the batch applied to a router :class:`PrefixIndex` by a ``PodSubscriber``
   running in another process, at a paced rate.

Prints a Markdown table; numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from kvstore.events import EventsConfig, build_bus
from kvstore.events.zmq_publisher import ZmqPublisher
from kvstore.hashing import PrefixHasher
from kvstore.types import BlockKey, BlockMeta, Medium

LOOPBACK_ANY = "tcp://127.0.0.1:*"


def _unchained(metas: list[BlockMeta]) -> list[BlockMeta]:
    """The same blocks, each announced as its own prefix (one event per block)."""
    return [BlockMeta(m.key, None, m.token_ids, m.size, 0) for m in metas]


def _metas(n: int, block_size: int) -> list[BlockMeta]:
    tokens = [(i * 7919) % 50_000 for i in range(n * block_size)]
    hasher = PrefixHasher(block_size, "xxhash_cbor", seed="0")
    metas: list[BlockMeta] = []
    parent: bytes | None = None
    for i, h in enumerate(hasher.iter_hashes(tokens)):
        chunk = tuple(tokens[i * block_size : (i + 1) * block_size])
        metas.append(BlockMeta(BlockKey("bench", h), parent, chunk, 1 << 16, 0))
        parent = h
    return metas


def _count_frames(endpoint: str, expect: int, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    out.send("ready")
    n = 0
    t_first = 0.0
    while n < expect:
        if not sub.poll(5000):
            break
        sub.recv_multipart()
        if n == 0:
            t_first = time.perf_counter()
        n += 1
    out.send((n, time.perf_counter() - t_first))
    sub.close(0)
    ctx.term()


async def _throughput(
    metas: list[BlockMeta], per_call: int, per_batch: int, encoding: str
) -> dict[str, Any]:
    cfg = EventsConfig(endpoint=LOOPBACK_ANY, replay_endpoint="", topic="bench",
                       encoding=encoding, hwm=1_000_000)  # type: ignore[arg-type]  # fmt: skip
    bus = build_bus(cfg)
    await bus.start()
    pub = bus._publishers[0]
    assert isinstance(pub, ZmqPublisher)
    calls = [metas[i : i + per_call] for i in range(0, len(metas), per_call)]
    n_batches = -(-len(calls) // per_batch)
    ours, theirs = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=_count_frames, args=(pub.endpoint, n_batches, theirs)
    )
    proc.start()
    ours.recv()
    await asyncio.sleep(0.5)
    t0 = time.perf_counter()
    for i, call in enumerate(calls, 1):
        bus.block_stored(call, Medium.GPU)
        if i % per_batch == 0:
            bus.flush()
    bus.flush()
    publish_s = time.perf_counter() - t0
    received, recv_s = await asyncio.to_thread(ours.recv)
    proc.join()
    await bus.close()
    return {
        "blocks": len(metas),
        "events": bus.events_published,
        "batches": n_batches,
        "received": received,
        "publish_s": publish_s,
        "blocks_per_s": len(metas) / publish_s,
        "events_per_s": bus.events_published / publish_s,
    }


def _router_process(endpoint: str, replay: str, expect: int, out: Any) -> None:
    from kvstore.connectors.router import PodSubscriber, PrefixIndex

    lat: list[float] = []

    def applied(pod: str, seq: int, batch: Any) -> None:
        lat.append(time.time() - batch.ts)

    async def main() -> None:
        sub = PodSubscriber("p", endpoint, PrefixIndex(), replay_endpoint=replay,
                            start_seq=0, on_applied=applied)  # fmt: skip
        await sub.start()
        await sub.wait_synced()
        out.send("ready")
        for _ in range(6000):
            if len(lat) >= expect:
                break
            await asyncio.sleep(0.005)
        out.send((lat, sub.stats.gaps, sub.stats.missed))
        await sub.close()

    asyncio.run(main())


async def _latency(n_batches: int, interval_s: float, blocks_per_batch: int) -> dict[str, Any]:
    cfg = EventsConfig(endpoint=LOOPBACK_ANY, replay_endpoint=LOOPBACK_ANY, topic="bench")
    bus = build_bus(cfg)
    await bus.start()
    pub = bus._publishers[0]
    assert isinstance(pub, ZmqPublisher)
    metas = _metas(n_batches * blocks_per_batch, 16)
    ours, theirs = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=_router_process, args=(pub.endpoint, pub.replay_endpoint, n_batches, theirs)
    )
    proc.start()
    await asyncio.to_thread(ours.recv)
    await asyncio.sleep(0.5)
    for i in range(n_batches):
        bus.block_stored(metas[i * blocks_per_batch : (i + 1) * blocks_per_batch], Medium.GPU)
        bus.flush()
        await asyncio.sleep(interval_s)
    lat, gaps, missed = await asyncio.to_thread(ours.recv)
    proc.join()
    await bus.close()
    lat_ms = sorted(x * 1e3 for x in lat)
    q = statistics.quantiles(lat_ms, n=100) if len(lat_ms) > 1 else [0.0] * 99
    return {"n": len(lat_ms), "p50_ms": q[49], "p99_ms": q[98], "max_ms": lat_ms[-1],
            "gaps": gaps, "missed": missed}  # fmt: skip


async def run(blocks: int, latency_batches: int) -> None:
    print(f"# kvstore events benchmark (cpus={os.cpu_count()}, load={os.getloadavg()[0]:.2f})\n")
    print("## Throughput: BlockMeta -> bus -> ZMQ PUB -> SUB (other process)\n")
    print(
        "| encoding | blocks | blocks/call | calls/batch | blocks total | batches | received "
        "| block events/s | BlockStored events/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    chained = _metas(blocks, 16)
    shapes = (("separate", 1, 64), ("chained", 1, 64), ("chained", 16, 32))
    for encoding in ("map", "array"):
        for kind, per_call, per_batch in shapes:
            metas = _unchained(chained) if kind == "separate" else chained
            r = await _throughput(metas, per_call, per_batch, encoding)
            print(
                f"| {encoding} | {kind} | {per_call} | {per_batch} | {r['blocks']} "
                f"| {r['batches']} | {r['received']} | {r['blocks_per_s']:,.0f} "
                f"| {r['events_per_s']:,.0f} |"
            )
    print("\n## Latency: bus flush -> PrefixIndex applied (router in other process)\n")
    print("| batches | interval | blocks/batch | p50 ms | p99 ms | max ms | gaps | missed |")
    print("|---|---|---|---|---|---|---|---|")
    for interval, per_batch in ((0.002, 4), (0.0, 16)):
        r = await _latency(latency_batches, interval, per_batch)
        print(
            f"| {r['n']} | {interval * 1e3:.0f} ms | {per_batch} | {r['p50_ms']:.3f} "
            f"| {r['p99_ms']:.3f} | {r['max_ms']:.3f} | {r['gaps']} | {r['missed']} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore bench-events")
    parser.add_argument("--blocks", type=int, default=200_000)
    parser.add_argument("--latency-batches", type=int, default=2000)
    args = parser.parse_args(argv)
    asyncio.run(run(args.blocks, args.latency_batches))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
