"""Property-based fuzzing of the trace parser (``kvstore.replay.trace``): any line
(arbitrary text, arbitrary JSON, mutated real lines, invalid UTF-8, non-finite
numbers) either parses to a well-formed request or raises TraceError naming the
file and the line, never another exception."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.replay.trace import AFTER_KINDS, Request, TraceError, load_trace
from tests.fuzzing import FUZZ

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=20)

fields = st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids",
                          "session_id", "workload", "after"])

good_lines = st.builds(
    lambda ts, n_in, n_out, ids, sid, after: json.dumps(
        {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids,
         **({"session_id": sid} if sid is not None else {}),
         **({"after": {"kind": after}} if after else {})}),
    st.integers(0, 2**40), st.integers(0, 10**6), st.integers(0, 10**5),
    st.lists(st.integers(0, 2**40), max_size=10), st.one_of(st.none(), st.text(max_size=8)),
    st.one_of(st.none(), st.sampled_from(AFTER_KINDS)))


def check(tmp: Path, lines: list[bytes]) -> None:
    path = tmp / "trace.jsonl"
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(data)
    try:
        reqs = load_trace(path)
    except TraceError as exc:
        msg = str(exc)
        assert str(path) in msg, msg
        line = int(msg.split(f"{path}:", 1)[1].split(":", 1)[0])
        assert 1 <= line <= data.count(b"\n"), msg  # (a generated line may hold a newline)
        return
    for r in reqs:  # what parses is well formed
        assert isinstance(r, Request)
        assert all(isinstance(v, int) and v >= 0
                   for v in (r.timestamp_ms, r.input_length, r.output_length, *r.hash_ids))
        assert r.after is None or r.after.kind in AFTER_KINDS


@FUZZ
@given(st.lists(st.text(max_size=60), min_size=1, max_size=4))
def test_arbitrary_text(tmp_path_factory, lines):
    check(tmp_path_factory.mktemp("t"), [s.encode("utf-8", "surrogatepass") for s in lines])


@FUZZ
@given(st.lists(json_values, min_size=1, max_size=3))
def test_arbitrary_json(tmp_path_factory, values):
    check(tmp_path_factory.mktemp("t"), [json.dumps(v).encode() for v in values])


@FUZZ
@given(good_lines, fields, json_values)
def test_a_field_of_any_type(tmp_path_factory, line, field, value):
    obj = json.loads(line)
    obj[field] = value
    check(tmp_path_factory.mktemp("t"), [line.encode(), json.dumps(obj).encode()])


@FUZZ
@given(good_lines, st.lists(st.tuples(st.integers(0, 500), st.integers(0, 255)), min_size=1,
                            max_size=4))
def test_mutated_lines(tmp_path_factory, line, mutations):
    data = bytearray(line.encode())
    for pos, byte in mutations:
        i = pos % (len(data) + 1)
        if i < len(data) and byte % 3:
            data[i] = byte
        else:
            data.insert(i, byte)
    check(tmp_path_factory.mktemp("t"), [line.encode(), bytes(data).replace(b"\n", b" ")])


@pytest.mark.parametrize("line", [
    b'{"timestamp": Infinity, "input_length": 1, "output_length": 1, "hash_ids": []}',
    b'{"timestamp": 1, "input_length": NaN, "output_length": 1, "hash_ids": []}',
    b'{"timestamp": 1e400, "input_length": 1, "output_length": 1, "hash_ids": []}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [-Infinity]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": "123"}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": {"1": 2}}',
    b'{"timestamp": -5, "input_length": 1, "output_length": 1, "hash_ids": []}',
    b'{"timestamp": 1, "input_length": -1, "output_length": 1, "hash_ids": [1]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1.5]}',
    b'{"timestamp": true, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1], "after": "x"}',
    b'{"timestamp": 1, "input_length": 1, "hash_ids": [1], "after": {"kind": ["user"]}}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]} \xff\xfe',
])
def test_bad_lines_name_their_file_and_line(tmp_path, line):
    """Regressions found by the fuzzing: each raised OverflowError, RecursionError,
    UnicodeDecodeError or was silently taken as something else."""
    good = b'{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [7]}'
    path = tmp_path / "trace.jsonl"
    path.write_bytes(good + b"\n" + line + b"\n")
    with pytest.raises(TraceError, match=f"{path}:2: "):
        load_trace(path)


def test_integral_floats_still_parse(tmp_path):
    """Traces written by tools that print 12.0 for 12 keep loading."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 12.0, "input_length": 512.0, "output_length": 0, '
                    '"hash_ids": [1.0, 2]}\n')
    (req,) = load_trace(path)
    assert (req.timestamp_ms, req.input_length, req.hash_ids) == (12, 512, (1, 2))
    assert not math.isnan(req.timestamp_ms)
