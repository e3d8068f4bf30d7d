"""Sessions: calls per session, tokens read back per call, and the gap after a
call by what followed it (a tool call, a user turn).

A gap is the time from one call to the session's next call, labelled by what
the trace (or a hint) said follows the earlier call: ``tool_call`` (and
``tool_call:<tool>`` when the tool is named), ``user``, ``end``, or
``unlabelled``. It bounds the earlier request's duration from above and is the
time its blocks must survive in cache to be reused.

Tokens read back are the leading tokens of a call an unbounded cache would
serve (its prefix hit times the block size, at most its input), counted for
every call after a session's first; new tokens are the rest of its input.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvstore.profile.dist import Dist
from kvstore.profile.model import Row, Sessions

__all__ = ["UNLABELLED", "gap_order", "session_stats"]

UNLABELLED = "unlabelled"


def gap_order(kinds: Iterable[str]) -> list[str]:
    """Gap kinds in report order: tool calls (then per tool), user, end, unlabelled."""
    rank = {"tool_call": 0, "user": 1, "end": 2, UNLABELLED: 4}
    return sorted(kinds, key=lambda k: (rank.get(k.split(":")[0], 3), ":" in k, k))


def _label(row: Row) -> list[str]:
    if row.after is None:
        return [UNLABELLED]
    if row.after == "tool_call" and row.tool:
        return ["tool_call", f"tool_call:{row.tool}"]
    return [row.after]


def session_stats(rows: Sequence[Row], block_tokens: int, inferred: bool = False
                  ) -> Sessions | None:
    """``rows`` sorted by time; None when no row belongs to a session."""
    by_session: dict[str, list[Row]] = {}
    for r in rows:
        if r.session is not None:
            by_session.setdefault(r.session, []).append(r)
    if not by_session:
        return None
    gaps: dict[str, list[float]] = {}
    read_back: list[int] = []
    new: list[int] = []
    durations: list[float] = []
    for calls in by_session.values():
        for prev, cur in zip(calls, calls[1:], strict=False):
            for label in _label(prev):
                gaps.setdefault(label, []).append(cur.t_s - prev.t_s)
            if cur.hit_blocks is not None:
                back = min(cur.hit_blocks * block_tokens, cur.input_tokens)
                read_back.append(back)
                new.append(cur.input_tokens - back)
        if len(calls) > 1:
            durations.append(calls[-1].t_s - calls[0].t_s)
    order = gap_order(gaps)
    return Sessions(
        sessions=len(by_session),
        inferred=inferred,
        calls_per_session=Dist.of(len(c) for c in by_session.values()),
        read_back_tokens=Dist.of(read_back),
        new_tokens=Dist.of(new),
        gaps_s={k: d for k in order if (d := Dist.of(gaps[k])) is not None},
        duration_s=Dist.of(durations),
    )
