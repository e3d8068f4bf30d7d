"""Mooncake-format traces: one JSON object per line, gzip or not.

Required fields: ``timestamp`` (ms), ``input_length``, ``output_length``,
``hash_ids`` (one id per 512-token block). Optional: ``session_id``,
``workload`` and ``after`` = ``{"kind": "tool_call", "tool": NAME}`` |
``{"kind": "user"}`` | ``{"kind": "end"}`` (what follows this request).
"""

from __future__ import annotations

import gzip
import json
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
        return out


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8"))
    return path.open(mode, encoding="utf-8")


def _parse(obj: Any, where: str) -> Request:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object")
    try:
        hash_ids = tuple(int(h) for h in obj["hash_ids"])
        after_obj = obj.get("after")
        after = None
        if after_obj is not None:
            kind = str(after_obj["kind"])
            if kind not in AFTER_KINDS:
                raise TraceError(f"{where}: after.kind {kind!r} not one of {AFTER_KINDS}")
            tool = after_obj.get("tool")
            after = After(kind, None if tool is None else str(tool))
        session = obj.get("session_id")
        workload = obj.get("workload")
        return Request(
            timestamp_ms=int(obj["timestamp"]),
            input_length=int(obj["input_length"]),
            output_length=int(obj.get("output_length", 0)),
            hash_ids=hash_ids,
            session_id=None if session is None else str(session),
            workload=None if workload is None else str(workload),
            after=after,
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, TraceError):
            raise
        raise TraceError(f"{where}: bad or missing field ({exc!r})") from exc


def iter_trace(path: str | Path) -> Iterator[Request]:
    p = Path(path)
    with _open(p, "r") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{p}:{lineno}: not JSON ({exc.msg})") from exc
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
