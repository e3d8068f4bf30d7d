"""Redis tier vs raw redis-py, same bytes, same run.

    kvstore bench-redis [--url redis://127.0.0.1:6379/0]
        [--cluster-nodes H:P,...] [--local-cluster] [--block-mib 1] [--blocks 64]
        [--clients 1,16] [--repeats 5]

For each mode (one Redis at ``--url``; a Redis Cluster at ``--cluster-nodes``, or three
masters started here on free loopback ports with ``--local-cluster``) and each client
count, C concurrent asyncio clients each put then get their share of ``--blocks`` blocks
of ``--block-mib``, one call per block: through :class:`RedisTier` (a pipeline of chunk
SETs + header SET with a TTL; reads one MGET of header + chunks, the payload checked
against the header's xxh3-64) and through raw redis-py ``SET`` / ``GET`` of the same
bytes (same hiredis parser, same pool size). The two alternate within every repeat,
which of them goes first alternating too, so machine noise hits both; GB/s are medians,
and the ratio is tier / raw. Keys go under a prefix of their own and are deleted afterwards.
Timings only, no assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kvstore.config import RedisConfig
from kvstore.tiers.redis import RedisTier
from kvstore.tiers.redisconn import make_client
from kvstore.tools.harness import free_port
from kvstore.types import BlockKey, BlockMeta

__all__ = ["main", "run"]


@contextlib.contextmanager
def local_cluster(masters: int = 3) -> Iterator[list[str]]:
    """``masters`` cluster nodes on free loopback ports, joined by ``redis-cli --cluster
    create``; stopped on exit."""
    if not shutil.which("redis-server"):
        raise SystemExit("--local-cluster needs redis-server and redis-cli on PATH")
    tmp = Path(tempfile.mkdtemp(prefix="kvbench-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    addrs: list[str] = []
    try:
        for i in range(masters):
            port = free_port()
            (tmp / str(i)).mkdir()
            procs.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                 "--cluster-config-file", "nodes.conf", "--dir", str(tmp / str(i)),
                 "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            addrs.append(f"127.0.0.1:{port}")
        _wait(lambda: all(_cli(a, "ping") == "PONG" for a in addrs))
        subprocess.run(["redis-cli", "--cluster", "create", *addrs, "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        _wait(lambda: all("cluster_state:ok" in _cli(a, "cluster", "info") for a in addrs))
        yield addrs
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def _cli(addr: str, *args: str) -> str:
    host, _, port = addr.rpartition(":")
    out = subprocess.run(["redis-cli", "-h", host, "-p", port, *args], capture_output=True,
                         text=True, timeout=5, check=False)
    return out.stdout.strip()


def _wait(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("redis did not come up")
        time.sleep(0.05)


async def _clients(n: int, per: int, op: Callable[[int], Awaitable[Any]]) -> None:
    async def one(c: int) -> None:
        for i in range(c * per, (c + 1) * per):
            await op(i)

    await asyncio.gather(*(one(c) for c in range(n)))


async def _timed(fn: Callable[[], Awaitable[Any]], nbytes: int) -> float:
    start = time.perf_counter()
    await fn()
    return nbytes / (time.perf_counter() - start) / 1e9


async def run(cfg: RedisConfig, block: int, blocks: int, clients: int, repeats: int
              ) -> dict[str, float]:
    """Median GB/s of tier put / get and raw SET / GET for one mode and client count."""
    data = np.random.default_rng(0).integers(0, 255, block, dtype=np.uint8).tobytes()
    checksum = xxhash.xxh3_64_intdigest(data)
    per = max(1, blocks // clients)
    n = per * clients
    metas = [BlockMeta(BlockKey("bench", i.to_bytes(32, "big")), None, tuple(range(16)),
                       block, checksum) for i in range(n)]
    raw_keys = [f"{cfg.key_prefix}:raw:{i}".encode() for i in range(n)]
    tier = RedisTier(cfg)
    raw = make_client(cfg)

    async def tier_get(i: int) -> None:
        got = await tier.get(metas[i].key)
        assert len(got) == block

    async def raw_get(i: int) -> None:
        got = await raw.get(raw_keys[i])
        assert len(got) == block

    ops: list[tuple[str, Callable[[int], Awaitable[Any]]]] = [
        ("raw SET", lambda i: raw.set(raw_keys[i], data)),
        ("tier put", lambda i: tier.put(metas[i], data)),
        ("raw GET", raw_get),
        ("tier get", tier_get),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _ in ops}
    try:
        if cfg.cluster:
            await raw.initialize()  # as the tier does (redis-py's lazy one races)
        await _clients(clients, per, ops[0][1])  # warm up pools and Redis's allocator
        await _clients(clients, per, ops[1][1])
        for rep in range(repeats):
            flip = rep % 2  # raw first, then tier first: drift in machine load hits both
            order = [ops[0 + flip], ops[1 - flip], ops[2 + flip], ops[3 - flip]]
            for name, op in order:
                rates[name].append(await _timed(partial(_clients, clients, per, op),
                                                n * block))
    finally:
        await tier.delete_many([m.key for m in metas])
        for k in raw_keys:
            await raw.delete(k)
        await tier.close()
        await raw.aclose()
    return {name: statistics.median(r) for name, r in rates.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvstore bench-redis", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default="redis://127.0.0.1:6379/0", help="standalone Redis")
    p.add_argument("--cluster-nodes", default="", help="HOST:PORT,... of a Redis Cluster")
    p.add_argument("--local-cluster", action="store_true",
                   help="start a 3-master cluster on free loopback ports for the run")
    p.add_argument("--block-mib", type=float, default=1.0)
    p.add_argument("--blocks", type=int, default=64, help="blocks per round (all clients)")
    p.add_argument("--clients", default="1,16")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    block = int(args.block_mib * (1 << 20))
    prefix = f"kvbench-{uuid.uuid4().hex[:8]}"
    common: dict[str, Any] = {"key_prefix": prefix, "capacity": 1 << 40, "timeout": 30.0,
                              "max_connections": 64}
    with contextlib.ExitStack() as stack:
        modes: list[tuple[str, RedisConfig]] = []
        if args.url:
            modes.append(("standalone", RedisConfig(url=args.url, **common)))
        nodes = tuple(n for n in args.cluster_nodes.split(",") if n)
        if args.local_cluster:
            nodes = tuple(stack.enter_context(local_cluster()))
        if nodes:
            modes.append(("cluster", RedisConfig(cluster_nodes=nodes, **common)))
        print(f"{block} bytes per block, {args.blocks} blocks per round, median of "
              f"{args.repeats}; ratio = tier / raw redis-py")
        print(f"{'mode':<11}{'clients':>8}{'raw SET':>10}{'tier put':>10}{'ratio':>7}"
              f"{'raw GET':>10}{'tier get':>10}{'ratio':>7}   (GB/s)")
        for mode, cfg in modes:
            for clients in (int(c) for c in args.clients.split(",")):
                r = asyncio.run(run(cfg, block, args.blocks, clients, args.repeats))
                print(f"{mode:<11}{clients:>8}{r['raw SET']:>10.2f}{r['tier put']:>10.2f}"
                      f"{r['tier put'] / r['raw SET']:>7.2f}{r['raw GET']:>10.2f}"
                      f"{r['tier get']:>10.2f}{r['tier get'] / r['raw GET']:>7.2f}")


if __name__ == "__main__":
    main()
