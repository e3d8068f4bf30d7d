from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvstore.replay import cli
from kvstore.replay.belady import belady_hit_rate
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.trace import load_trace
from tests.replay.helpers import replay

SMALL = GenConfig(sessions=60, duration_s=600.0, seed=3, scale=0.1)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_generates_a_valid_deterministic_trace(kind: str) -> None:
    a = generate(kind, SMALL)
    assert a == generate(kind, SMALL)
    assert a and all(r.hash_ids and r.session_id and r.after for r in a)
    assert [r.timestamp_ms for r in a] == sorted(r.timestamp_ms for r in a)
    ends = {r.session_id for r in a if r.after and r.after.kind == "end"}
    assert ends == {r.session_id for r in a}


def test_agent_sessions_share_a_prompt_and_grow() -> None:
    reqs = generate("agent", GenConfig(sessions=20, seed=1, scale=0.05))
    first = {r.hash_ids[:3] for r in reqs}
    assert len(first) == 1, "system prompt and tool schema are shared"
    tools = {r.after.tool for r in reqs if r.after and r.after.kind == "tool_call"}
    assert len(tools) >= 3
    by_session: dict[str, list[int]] = {}
    for r in reqs:
        by_session.setdefault(str(r.session_id), []).append(len(r.hash_ids))
    assert all(lens == sorted(lens) for lens in by_session.values())


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="valid: chat"):
        generate("poetry", SMALL)


def test_belady_bounds_every_policy() -> None:
    from kvstore import policies

    reqs = generate("mixed", GenConfig(sessions=150, duration_s=300.0, seed=5, scale=0.1))
    for cap in (20, 80):
        # workload refuses admissions, so its bound is the optimum with bypass
        bound = belady_hit_rate(reqs, cap, bypass=True)
        assert bound >= belady_hit_rate(reqs, cap) - 1e-9
        for name in policies.available():
            assert replay(reqs, name, [("dram", cap)]).hit_rate <= bound + 1e-9, name


def test_cli_registers_replay_and_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kvstore")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.add_parser(sub)
    trace = tmp_path / "agent.jsonl.gz"
    args = parser.parse_args(["replay", str(trace), "--generate", "agent", "--sessions", "30",
                              "--scale", "0.05", "--duration-s", "300"])
    assert args.func(args) == 0
    assert len(load_trace(trace)) > 30
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    args = parser.parse_args([
        "replay", str(trace), "--policy", "lru", "--policy", "workload", "--engine-blocks", "10",
        "--dram-blocks", "20,40", "--disk-blocks", "80", "--belady", "--json", str(out_json),
        "--plot", str(out_png), "--no-progress"])
    assert args.func(args) == 0
    doc = json.loads(out_json.read_text())
    assert [r["policy"] for r in doc["results"]] == ["lru", "workload", "lru", "workload"]
    first = doc["results"][0]
    assert set(first["hits_by_tier"]) == {"engine", "dram", "disk", "redis"}
    assert sum(first["hits_by_tier"].values()) == pytest.approx(first["hit_rate"])
    assert set(doc["belady"]) == {"100", "120"}
    assert out_png.stat().st_size > 1000
    assert "workload" in capsys.readouterr().out


def test_cli_errors_are_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert cli.main(["replay", str(tmp_path / "x.jsonl"), "--policy", "nope"]) == 2
    err = capsys.readouterr().err
    assert "missing.jsonl" in err and "valid:" in err
