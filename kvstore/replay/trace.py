"""Mooncake-format traces: one JSON object per line, gzip or not.

Required fields: ``timestamp`` (ms), ``input_length``, ``output_length``,
``hash_ids`` (one id per 512-token block). Optional: ``session_id``,
``workload`` and ``after`` = ``{"kind": "tool_call", "tool": NAME}`` |
``{"kind": "user"}`` | ``{"kind": "end"}`` (what follows this request),
``cache_ttl_s`` (the client retains the request's blocks for that many seconds, as
``kv_transfer_params: {"cache_ttl_s": ...}`` does) and ``cache_blocks`` (how many
leading blocks it retains, a ``cache_control`` breakpoint; absent: all of them).
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

__all__ = ["AFTER_KINDS", "After", "Request", "TraceError", "dump_trace", "load_trace"]

AFTER_KINDS = ("tool_call", "user", "end")


class TraceError(ValueError):
    """A trace line is malformed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class After:
    kind: str
    tool: str | None = None


@dataclass(frozen=True, slots=True)
class Request:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_id: str | None = None
    workload: str | None = None
    after: After | None = None
    cache_ttl_s: float | None = None
    cache_blocks: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "timestamp": self.timestamp_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
        }
        if self.session_id is not None:
            out["session_id"] = self.session_id
        if self.workload is not None:
            out["workload"] = self.workload
        if self.after is not None:
            after: dict[str, str] = {"kind": self.after.kind}
            if self.after.tool is not None:
                after["tool"] = self.after.tool
            out["after"] = after
        if self.cache_ttl_s is not None:
            out["cache_ttl_s"] = self.cache_ttl_s
        if self.cache_blocks is not None:
            out["cache_blocks"] = self.cache_blocks
        return out


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8"))
    return path.open(mode, encoding="utf-8")


def _count(obj: dict[str, Any], name: str, where: str, default: int | None = None) -> int:
    """A non-negative integer field: a JSON integer (or an integral number like 12.0)."""
    value = obj.get(name, default)
    if value is None:
        raise TraceError(f"{where}: missing field {name!r}")
    if isinstance(value, float) and value.is_integer():  # (NaN and inf are not)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{where}: {name} must be a non-negative integer, got {value!r}")
    return value


def _text(value: Any, name: str, where: str, *, ints: bool = False) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) or (ints and isinstance(value, int)
                                  and not isinstance(value, bool)):
        return str(value)
    raise TraceError(f"{where}: {name} must be a string, got {value!r}")


def _seconds(value: Any, name: str, where: str) -> float | None:
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0):
        raise TraceError(f"{where}: {name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _parse(obj: Any, where: str) -> Request:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object")
    ids = obj.get("hash_ids")
    if not isinstance(ids, list):
        raise TraceError(f"{where}: hash_ids must be a list of integers, got {ids!r}")
    if ids and set(map(type, ids)) == {int} and min(ids) >= 0:
        hash_ids = tuple(ids)  # the usual case, checked at C speed
    else:
        hash_ids = tuple(_count({"hash_ids": h}, "hash_ids", where) for h in ids)
    after_obj = obj.get("after")
    after = None
    if after_obj is not None:
        if not isinstance(after_obj, dict):
            raise TraceError(f"{where}: after must be an object like {{\"kind\": \"user\"}}, "
                             f"got {after_obj!r}")
        kind = after_obj.get("kind")
        if not isinstance(kind, str) or kind not in AFTER_KINDS:
            raise TraceError(f"{where}: after.kind {kind!r} not one of {AFTER_KINDS}")
        after = After(kind, _text(after_obj.get("tool"), "after.tool", where))
    return Request(
        timestamp_ms=_count(obj, "timestamp", where),
        input_length=_count(obj, "input_length", where),
        output_length=_count(obj, "output_length", where, default=0),
        hash_ids=hash_ids,
        session_id=_text(obj.get("session_id"), "session_id", where, ints=True),
        workload=_text(obj.get("workload"), "workload", where),
        after=after,
        cache_ttl_s=_seconds(obj.get("cache_ttl_s"), "cache_ttl_s", where),
        cache_blocks=(_count(obj, "cache_blocks", where) if obj.get("cache_blocks") is not None
                      else None),
    )


def iter_trace(path: str | Path) -> Iterator[Request]:
    p = Path(path)
    with (gzip.open(p, "rb") if p.suffix == ".gz" else p.open("rb")) as fh:
        lineno = 0
        while True:
            try:
                raw = fh.readline()
            except (OSError, EOFError, zlib.error) as exc:  # a damaged .gz
                raise TraceError(f"{p}:{lineno + 1}: unreadable ({exc})") from exc
            if not raw:
                return
            lineno += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(f"{p}:{lineno}: not UTF-8 ({exc.reason} at byte "
                                 f"{exc.start})") from exc
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{p}:{lineno}: not JSON ({exc.msg})") from exc
            except (ValueError, RecursionError) as exc:  # too many digits, too deep
                raise TraceError(f"{p}:{lineno}: not usable JSON ({exc})") from exc
            yield _parse(obj, f"{p}:{lineno}")


def load_trace(path: str | Path) -> list[Request]:
    """Load a whole trace, sorted by timestamp (stable, so in-file order breaks ties)."""
    reqs = list(iter_trace(path))
    reqs.sort(key=lambda r: r.timestamp_ms)
    return reqs


def dump_trace(requests: Iterable[Request], path: str | Path) -> int:
    """Write ``requests`` in the same format; returns the number of lines."""
    p = Path(path)
    n = 0
    with _open(p, "w") as fh:
        for req in requests:
            fh.write(json.dumps(req.to_json(), separators=(",", ":")))
            fh.write("\n")
            n += 1
    return n
