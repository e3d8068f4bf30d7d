"""The offline served replay agrees with a real vLLM engine + connector + ``kvstore serve``.

Runs ``bench_slice.py`` (the real-engine slice check) under the vLLM interpreter on a
generated agent trace: 60 requests of 7 sessions, one at a time, each trace block one
engine block of 32 tokens, an engine KV cache of 30 blocks and a sidecar DRAM of 80
(one engine start, ~10 s of requests). The replay of the same slice must agree on the
hits of each tier within 2 points, and the check must be able to fail: the replay at
other capacities disagrees. Skips, saying why, where the vLLM interpreter or the
``kvstore`` executable is missing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.vllm.test_connector_e2e import run_vllm_script

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

ENGINE, DRAM = 30, 80
OTHER_ENGINE, OTHER_DRAM = 40, 40
POINTS = 2.0


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> dict[str, Any]:
    data, out, _ = run_vllm_script(
        tmp_path_factory, vllm_python, "bench_slice.py",
        ["--generate", "agent", "--gen-sessions", "10", "--scale", "0.05", "--duration-s", "300",
         "--sessions", "10", "--requests", "60", "--engine-blocks", str(ENGINE),
         "--dram-blocks", str(DRAM), "--replay-engine-blocks", str(OTHER_ENGINE),
         "--replay-dram-blocks", str(OTHER_DRAM)], 540)
    data["_table"] = "\n".join(ln for ln in out.splitlines()
                                if ln.startswith(("|", "slice:", "replay ")))
    return data


def _diff(real: dict[str, Any], replay: dict[str, Any], tier: str) -> float:
    return 100 * abs(replay["hits_by_tier"][tier] - real["hits_by_tier"][tier])


def test_the_real_run_uses_both_tiers_under_pressure(result: dict[str, Any]) -> None:
    real = result["real"]
    assert result["slice"]["requests"] == real["requests"] == 60
    assert real["lookups"] == result["replay"]["lookups"] == result["slice"]["trace_blocks"]
    # Both tiers serve a real share, so agreeing on each says something.
    assert real["hits_by_tier"]["engine"] > 0.3 and real["hits_by_tier"]["dram"] > 0.1
    assert real["load_failed_blocks"] == 0 and real["settle_timeouts"] == 0
    side = real["sidecar"]
    # DRAM capacity is D payloads exactly, and it was full: it evicted.
    assert side["dram_capacity_bytes"] == DRAM * side["payload_bytes"]
    assert side["dram_used_bytes"] == side["blocks"] * side["payload_bytes"]
    assert side["blocks"] == DRAM and side["dram_evictions"] > 0


def test_the_replay_agrees_with_the_real_engine_per_tier(result: dict[str, Any]) -> None:
    real, replay = result["real"], result["replay"]
    for tier in ("engine", "dram"):
        assert _diff(real, replay, tier) <= POINTS, result["_table"]


def test_the_check_can_fail_at_other_capacities(result: dict[str, Any]) -> None:
    real = result["real"]
    other_engine, other_dram = result["other_replays"]
    assert other_engine["engine_blocks"] == OTHER_ENGINE
    assert other_dram["dram_blocks"] == OTHER_DRAM
    for other in (other_engine, other_dram):
        assert max(_diff(real, other, t) for t in ("engine", "dram")) > POINTS
