"""Retrieve latency of plugin settings side by side, one request at a time, interleaved.

``kvstore bench-lmcache-compare`` (in the LMCache venv) starts a
``kvstore serve`` (DRAM only), stores ``--requests`` prompts through the plugin and
into LMCache's local CPU backend, then retrieves every prompt with each reader in
turn (request by request, so each reader sees the same machine at the same
moment): the plugin with ``hold_ahead_s`` 0 (contains looks up, the get acquires),
the plugin as configured by default (contains looks up and holds in one round
trip), and the local CPU backend. Prints each reader's median and quartiles per
32 MiB request and the ratios to the local backend. On a shared machine the
interleaving is what makes the difference between two settings visible: the
best-of-rounds GB/s of :mod:`.bench` moves by more than it from one run to the
next. Every retrieve must hit every token (checked).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvstore bench-lmcache-compare",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--repeats", type=int, default=4)
    args = p.parse_args(argv)

    import torch
    from kvstore.connectors.lmcache.cpu_kv import PutTracker, destroy_engine, make_engine

    from kvstore.tools.harness import dram_only_server
    from kvstore.tools.lmcache import bench

    shape = bench.Shape(16, 8, 64, 256, 4)
    tokens = shape.chunk * shape.chunks
    dims = {"num_layers": shape.layers, "num_kv_heads": shape.kv_heads,
            "head_size": shape.head_size}
    request_mib = shape.chunk_bytes * shape.chunks // 2**20
    engines: list[Any] = []
    with dram_only_server(f"{args.requests * request_mib + 256}MiB") as addr:
        def plugin(hold_ahead_s: float) -> Any:
            config = bench.lmcache_config("kvstore", shape, 1.0, "", addr,
                                          hold_ahead_s=hold_ahead_s)
            engines.append(make_engine(config, **dims)[0])
            return engines[-1]

        try:
            writer = plugin(1.0)
            tracker = PutTracker(writer)
            local_pool = args.requests * request_mib * 1.5 / 1024 + 0.25
            engines.append(make_engine(bench.lmcache_config(
                "local_cpu", shape, round(local_pool, 2), "", ""), **dims)[0])
            local = engines[-1]
            kv = torch.randn(2, shape.layers, tokens, shape.kv_heads * shape.head_size,
                             generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            prompts = [torch.randint(0, 30000, (tokens,),
                                     generator=torch.Generator().manual_seed(i))
                       for i in range(args.requests)]
            for prompt in prompts:
                writer.store(prompt, kvcaches=kv)
                tracker.wait_keys(
                    [k for _, _, k in writer.token_database.process_tokens(prompt)], 120)
                local.store(prompt, kvcaches=kv)
            readers = {"plugin, hold_ahead_s 0": plugin(0.0),
                       "plugin, default (hold ahead)": plugin(1.0), "local_cpu": local}
            out = torch.zeros_like(kv)
            for reader in readers.values():  # connects the plugins' clients
                reader.retrieve(prompts[0], kvcaches=out)
            took: dict[str, list[float]] = {name: [] for name in readers}
            for _ in range(args.repeats):
                for prompt in prompts:
                    for name, reader in readers.items():
                        started = time.perf_counter()
                        hit = reader.retrieve(prompt, kvcaches=out)
                        took[name].append(time.perf_counter() - started)
                        if int(hit.sum()) != tokens:
                            raise RuntimeError(f"{name}: a retrieve missed")
        finally:
            for engine in engines:
                destroy_engine(engine)
    local_ms = statistics.median(took["local_cpu"]) * 1e3
    print(f"ms per {request_mib} MiB request, {len(took['local_cpu'])} requests each, "
          "interleaved:")
    for name, seconds in took.items():
        q1, med, q3 = (x * 1e3 for x in statistics.quantiles(seconds, n=4))
        print(f"  {name:<30} median {med:6.2f}  quartiles {q1:6.2f} / {q3:6.2f}  "
              f"local / this {local_ms / med:.2f}")


if __name__ == "__main__":
    main()
