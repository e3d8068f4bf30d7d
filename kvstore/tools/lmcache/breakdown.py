"""Where one LMCache retrieve through the plugin spends its time, one request at a time.

``kvstore bench-lmcache-breakdown`` (in the LMCache venv) starts a
``kvstore serve`` (DRAM only), stores ``--requests`` prompts with one engine, retrieves
them with a fresh one (``local_cpu: false``) and prints, per request: the whole
retrieve, the plugin's ``batched_contains`` (its ``Lookup``), its get on the plugin's
thread, and the ``Acquire`` / ``Release`` round trips and slot checksums inside it
(timed by wrapping the plugin's client; checksums summed over threads). The figures
in docs/benchmarks/lmcache.md come from it. ``--copy`` times the copying plugin.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvstore bench-lmcache-breakdown",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--copy", action="store_true", help="the plugin copies (zero_copy: false)")
    p.add_argument("--hold-ahead-s", type=float, default=1.0,
                   help="the plugin's hold_ahead_s (0: contains only looks up)")
    args = p.parse_args(argv)

    import torch
    import xxhash
    from kvstore.connectors.lmcache.cpu_kv import PutTracker, destroy_engine, make_engine

    import kvstore.client.inplace as inplace
    from kvstore.tools.harness import dram_only_server
    from kvstore.tools.lmcache import bench

    took: dict[str, float] = collections.defaultdict(float)

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                took[label] += time.perf_counter() - started
        return call

    shape = bench.Shape(16, 8, 64, 256, 4)
    tokens = shape.chunk * shape.chunks
    dims = {"num_layers": shape.layers, "num_kv_heads": shape.kv_heads,
            "head_size": shape.head_size}
    dram = f"{args.requests * shape.chunk_bytes * shape.chunks // 2**20 + 256}MiB"
    with dram_only_server(dram) as addr:
        config = bench.lmcache_config("kvstore", shape, 1.0, "", addr, zero_copy=not args.copy,
                                      hold_ahead_s=args.hold_ahead_s)
        writer, _ = make_engine(config, **dims)
        tracker = PutTracker(writer)
        reader, _ = make_engine(config, **dims)
        kv = torch.randn(2, shape.layers, tokens, shape.kv_heads * shape.head_size,
                         generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        prompts = [torch.randint(0, 30000, (tokens,), generator=torch.Generator().manual_seed(i))
                   for i in range(args.requests)]
        for prompt in prompts:
            writer.store(prompt, kvcaches=kv)
            tracker.wait_keys([k for _, _, k in writer.token_database.process_tokens(prompt)],
                              120)
        plugin = bench._plugin(reader)
        plugin._contains = timed("lookup (batched_contains)", plugin._contains)
        plugin._get = timed("get, on the plugin's thread", plugin._get)
        reader.retrieve(prompts[0], kvcaches=torch.zeros_like(kv))  # connects the client
        client = plugin.link._client
        call = client._call

        def rpc(fn: Any, *a: Any, **k: Any) -> Any:
            name = getattr(fn, "_method", b"").decode().rsplit("/", 1)[-1] or "rpc"
            return timed(f"  {name}", call)(fn, *a, **k)

        client._call = rpc
        digest = xxhash.xxh3_64_intdigest

        class _Timed:  # the module's xxhash, with its checksums timed
            xxh3_64_intdigest = staticmethod(timed("  checksums (all threads)", digest))

        vars(inplace)["xxhash"] = _Timed
        out = torch.zeros_like(kv)
        try:
            for rep in range(args.repeats):
                took.clear()
                started = time.perf_counter()
                for prompt in prompts:
                    hit = timed("retrieve", reader.retrieve)(prompt, kvcaches=out)
                    assert int(hit.sum()) == tokens, "a retrieve missed"
                wall = time.perf_counter() - started
                gbps = args.requests * shape.chunks * shape.chunk_bytes / wall / 1e9
                print(f"repeat {rep}: {gbps:.2f} GB/s, {plugin.handed}; ms per request:")
                for label, seconds in took.items():
                    print(f"  {label:<32} {seconds / args.requests * 1e3:7.3f}")
        finally:
            vars(inplace)["xxhash"] = xxhash
            destroy_engine(writer)
            destroy_engine(reader)


if __name__ == "__main__":
    main()
