"""Load a trace for profiling: Mooncake JSONL (through :mod:`kvstore.replay.trace`,
with or without sessions) or an Azure LLM inference CSV
(``TIMESTAMP,ContextTokens,GeneratedTokens``: arrival times and lengths, no
hashes). The format is told by the first line.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, TypeVar

from kvstore.replay.trace import Request, TraceError, iter_trace

__all__ = ["MOONCAKE_BLOCK_TOKENS", "Progress", "Trace", "load", "no_progress"]

#: Tokens per hash id in Mooncake-format traces.
MOONCAKE_BLOCK_TOKENS = 512
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
T = TypeVar("T")
#: Wraps an iterable in a progress bar (or not): ``(items, total, description)``.
Progress = Callable[[Iterable[Any], "int | None", str], Iterable[Any]]


def no_progress(items: Iterable[T], total: int | None, desc: str) -> Iterable[T]:
    return items


@dataclass(frozen=True, slots=True)
class Trace:
    path: str
    #: ``mooncake``, ``mooncake+sessions`` or ``azure``.
    format: str
    #: Sorted by time (stable). Azure rows carry no hash ids.
    requests: list[Request]
    #: Arrival time of each request in seconds from the first (Azure keeps the
    #: CSV's sub-millisecond precision here; Mooncake has milliseconds).
    times_s: list[float]

    @property
    def has_hashes(self) -> bool:
        return self.format != "azure"

    @property
    def has_sessions(self) -> bool:
        return any(r.session_id is not None for r in self.requests)


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _first_line(path: Path) -> str:
    try:
        with _open(path) as fh:
            for line in fh:
                if line.strip():
                    return line.strip()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read ({exc})") from exc
    raise TraceError(f"{path}: the trace is empty")


def _azure_time(text: str, where: str) -> tuple[int, float]:
    """``2023-11-16 18:17:03.9799600`` -> (whole POSIX seconds, fraction), naive
    times read as UTC. Kept apart so differences keep every fractional digit
    (``datetime`` cuts the seventh, one float of POSIX seconds the sixth)."""
    head, _, frac = text.strip().partition(".")
    try:
        base = int(datetime.fromisoformat(head + "+00:00").timestamp())
        return base, (float("0." + frac) if frac else 0.0)
    except ValueError as exc:
        raise TraceError(f"{where}: TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.f]'") from exc


def _iter_azure(path: Path) -> Iterator[tuple[tuple[int, float], int, int]]:
    with _open(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != _AZURE_COLUMNS:
            raise TraceError(f"{path}:1: expected the header {','.join(_AZURE_COLUMNS)}, got "
                             f"{header!r}")
        for lineno, rec in enumerate(reader, 2):
            if not rec:
                continue
            where = f"{path}:{lineno}"
            if len(rec) < 3:
                raise TraceError(f"{where}: expected 3 columns, got {len(rec)}")
            try:
                inp, out = int(rec[1]), int(rec[2])
            except ValueError as exc:
                raise TraceError(f"{where}: ContextTokens / GeneratedTokens not integers "
                                 f"({rec[1]!r}, {rec[2]!r})") from exc
            if inp < 0 or out < 0:
                raise TraceError(f"{where}: negative token count ({inp}, {out})")
            yield _azure_time(rec[0], where), inp, out


def load(path: str | Path, progress: Progress = no_progress) -> Trace:
    """Read ``path`` (gzip or not); raises TraceError naming the file and line."""
    p = Path(path)
    first = _first_line(p)
    if first.startswith("{"):
        reqs = list(progress(iter_trace(p), None, "loading"))
        reqs.sort(key=lambda r: r.timestamp_ms)
        fmt = "mooncake+sessions" if any(r.session_id for r in reqs) else "mooncake"
        t0 = reqs[0].timestamp_ms if reqs else 0
        return Trace(str(p), fmt, reqs, [(r.timestamp_ms - t0) / 1000.0 for r in reqs])
    if first.split(",")[0].strip() == _AZURE_COLUMNS[0]:
        recs = sorted(progress(_iter_azure(p), None, "loading"), key=lambda x: x[0])
        if not recs:
            raise TraceError(f"{p}: the trace has a header and no requests")
        s0, f0 = recs[0][0]
        times = [(s - s0) + (f - f0) for (s, f), _, _ in recs]
        reqs = [Request(round(1000 * t), inp, out, ()) for t, (_, inp, out) in
                zip(times, recs, strict=True)]
        return Trace(str(p), "azure", reqs, times)
    raise TraceError(f"{p}:1: neither Mooncake JSONL (a JSON object per line) nor an Azure CSV "
                     f"(header {','.join(_AZURE_COLUMNS)}): {first[:80]!r}")
