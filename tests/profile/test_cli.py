"""``kvstore profile`` end to end on trace files: text, JSON, plots, errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvstore.cli import main
from kvstore.profile.load import load
from kvstore.profile.quadrants import classify
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.trace import TraceError, dump_trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:00:00.0000000,1000,100
2023-11-16 18:00:30.5000000,5000,50
2023-11-16 18:01:10.0000001,40000,20
2023-11-16 18:02:00.2500000,800,2000
"""


@pytest.fixture
def agent_trace(tmp_path: Path) -> Path:
    path = tmp_path / "agent.jsonl.gz"
    dump_trace(generate("agent", GenConfig(sessions=8, seed=7, scale=0.05)), path)
    return path


def test_profile_a_mooncake_trace(agent_trace: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "p.json"
    plots = tmp_path / "plots"
    rc = main(["profile", str(agent_trace), "--json", str(out_json), "--plot", str(plots),
               "--points", "3", "--model", "Qwen2.5-7B", "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    for heading in ("Lengths (tokens)", "Quadrants", "Arrival", "Prefix reuse",
                    "Sessions: 8 (from session ids)", "gap after tool_call (s)",
                    "Hit rate vs capacity", "Sizing for qwen2.5-7b (57,344 B",
                    "[engine]", "[dram]", "[disk]", "latency target: not recorded"):
        assert heading in text, heading
    doc = json.loads(out_json.read_text())
    n = len(generate("agent", GenConfig(sessions=8, seed=7, scale=0.05)))
    assert doc["requests"] == n and doc["format"] == "mooncake+sessions"
    want = {q: 0 for q in doc["lengths"]["quadrants"]}
    for r in generate("agent", GenConfig(sessions=8, seed=7, scale=0.05)):
        want[classify(r.input_length, r.output_length)] += 1
    assert doc["lengths"]["quadrants"] == want
    assert doc["sessions"]["sessions"] == 8
    pols = {p["policy"] for p in doc["curve"]["points"]}
    assert pols == {"lru", "workload", "belady"} and len(doc["curve"]["points"]) == 9
    assert [t["tier"] for t in doc["sizing"]["targets"]] == ["hbm", "dram", "disk"]
    assert doc["latency_target"] is None
    for name in ("lengths.png", "capacity.png", "arrival.png", "gaps.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_explicit_capacities_and_one_policy(agent_trace: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "p.json"
    assert main(["profile", str(agent_trace), "--capacities", "50,100", "--policy", "lru",
                 "--kv-bytes-per-token", "1000", "--json", str(out_json)]) == 0
    doc = json.loads(out_json.read_text())
    assert sorted((p["policy"], p["blocks"]) for p in doc["curve"]["points"]) == [
        ("belady", 50), ("belady", 100), ("lru", 50), ("lru", 100)]
    assert doc["sizing"]["kv_bytes_per_token"] == 1000


def test_no_curve(agent_trace: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "p.json"
    assert main(["profile", str(agent_trace), "--no-curve", "--json", str(out_json)]) == 0
    doc = json.loads(out_json.read_text())
    assert doc["curve"] is None and doc["sizing"] is None and doc["reuse"] is not None


def test_azure_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "azure.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(AZURE)
    trace = load(path)
    assert trace.format == "azure" and not trace.has_hashes
    assert trace.times_s == pytest.approx([0.0, 30.5, 70.0000001, 120.25], abs=1e-9)
    out_json = tmp_path / "p.json"
    plots = tmp_path / "plots"
    assert main(["profile", str(path), "--json", str(out_json), "--plot", str(plots)]) == 0
    text = capsys.readouterr().out
    assert "prefix reuse: cannot be computed: the trace carries no block hashes" in text
    doc = json.loads(out_json.read_text())
    assert doc["reuse"] is None and doc["curve"] is None and doc["sessions"] is None
    assert doc["lengths"]["quadrants"] == {"chat": 1, "rag": 1, "agent": 1, "reasoning": 1,
                                           "batch": 0}
    assert doc["arrival"]["bins"] == 2 and doc["arrival"]["peak"] == 2
    assert sorted(p.name for p in plots.iterdir()) == ["arrival.png", "lengths.png"]


@pytest.mark.parametrize(("content", "message"), [
    ("", "the trace is empty"),
    ("hello,world\n1,2\n", "neither Mooncake JSONL"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "TIMESTAMP 'yesterday'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,x,2\n", "not integers"),
    ('{"timestamp": 0, "input_length": 5}\n', "hash_ids must be a list"),
])
def test_bad_traces(tmp_path: Path, content: str, message: str,
                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        load(path)
    assert main(["profile", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_argument_errors(agent_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile"]) == 2
    assert "give a TRACE" in capsys.readouterr().err
    assert main(["profile", str(agent_trace), "--policy", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert main(["profile", str(agent_trace), "--model", "gpt-5"]) == 2
    assert "unknown model 'gpt-5'" in capsys.readouterr().err
    assert main(["profile", str(agent_trace), "--server", "127.0.0.1:1"]) == 2
    with pytest.raises(SystemExit):
        main(["profile", str(agent_trace), "--capacities", "0"])
