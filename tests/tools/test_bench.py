"""``kvstore bench`` against its own server, small: every row's bytes were read back equal
(``measure`` raises otherwise) and each shared-memory row carries the best and the median
round against the memcpy of the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstore import cli


def test_bench_times_the_block_sizes_asked_for(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert cli.main(["bench", "--mib", "2", "--repeats", "2", "--storm-s", "0.3",
                     "--block-kib", "64", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["block"], r["path"]) for r in rows] == [(65536, "shm"), (65536, "grpc")]
    for r in rows:
        for op in ("put", "get", "get_into"):
            assert r[f"{op}_gbps"] > 0
            # the best round is at least as fast as the median one
            assert r[f"{op}_vs_memcpy"] >= r[f"{op}_median_vs_memcpy"] > 0
    assert "the median round: put" in capsys.readouterr().out


def test_bench_refuses_a_block_size_of_zero() -> None:
    with pytest.raises(SystemExit, match="--block-kib must be > 0"):
        cli.main(["bench", "--block-kib", "0"])
