"""Retention in the replay: a trace's ``cache_ttl_s`` / ``cache_blocks`` round-trip and
are refused when malformed; the ``retained`` kind marks its shared prefixes; retaining
them lifts LRU's hit rate on it (the same engine the server runs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.trace import Request, TraceError, dump_trace, load_trace
from tests.replay.helpers import replay


def test_cache_fields_round_trip_and_bad_ones_are_refused(tmp_path: Path) -> None:
    reqs = [Request(0, 1024, 10, (1, 2), "s", "chat", None, cache_ttl_s=300.0, cache_blocks=1),
            Request(5, 512, 10, (3,), "t")]
    path = tmp_path / "t.jsonl"
    dump_trace(reqs, path)
    assert load_trace(path) == reqs
    for bad, field in (({"cache_ttl_s": -1}, "cache_ttl_s"), ({"cache_ttl_s": "1h"}, "cache_ttl_s"),
                       ({"cache_ttl_s": True}, "cache_ttl_s"),
                       ({"cache_blocks": 1.5}, "cache_blocks")):
        line = {"timestamp": 0, "input_length": 512, "hash_ids": [1], **bad}
        path.write_text(json.dumps(line) + "\n")
        with pytest.raises(TraceError, match=field):
            load_trace(path)


def test_the_retained_kind_marks_its_shared_prefixes() -> None:
    reqs = generate("retained", GenConfig(sessions=30, duration_s=600.0, seed=2, scale=0.1))
    assert reqs and all(r.cache_ttl_s == 3600.0 for r in reqs)
    heads = {r.hash_ids[:r.cache_blocks] for r in reqs if r.cache_blocks}
    assert 1 < len(heads) <= 6  # one shared prefix per app
    assert all(r.cache_blocks and r.cache_blocks < len(r.hash_ids) for r in reqs)


def test_retaining_the_shared_prefixes_lifts_lru() -> None:
    reqs = generate("retained", GenConfig(sessions=60, duration_s=3600.0, seed=1, scale=0.25))
    def hit_rate(requests: list[Request]) -> float:
        return replay(requests, "lru", [("dram", 100)]).hit_rate

    with_ttl = hit_rate(reqs)
    without = hit_rate([dataclasses.replace(r, cache_ttl_s=None) for r in reqs])
    assert with_ttl > without + 0.01, (with_ttl, without)
