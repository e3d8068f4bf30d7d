"""A trace's profile: its rows, every section, the capacity curve and the
sizing advice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvstore.profile.curves import DEFAULT_POINTS, DEFAULT_POLICIES, capacity_grid, measure_curve
from kvstore.profile.load import MOONCAKE_BLOCK_TOKENS, Progress, Trace, no_progress
from kvstore.profile.model import Profile, Row
from kvstore.profile.reuse import UnboundedCache
from kvstore.profile.sections import profile_rows
from kvstore.profile.sizing import DEFAULT_MODEL, model_kv, sizing

__all__ = ["profile_trace", "trace_rows"]

LATENCY_NOTE = ("latency target: not recorded (Mooncake JSONL and the Azure CSV carry arrival "
                "times and lengths only)")


def trace_rows(trace: Trace, progress: Progress = no_progress
               ) -> tuple[list[Row], bool, UnboundedCache | None]:
    """The rows of ``trace``, whether its sessions were inferred from prefix
    chains (the replay's inference, for traces with hashes and no session ids),
    and the unbounded cache that measured reuse (None without hashes)."""
    reqs = trace.requests
    sessions: list[str | None] = [r.session_id for r in reqs]
    inferred = False
    if trace.has_hashes and not trace.has_sessions:
        from kvstore.engine.sessions import Sessions

        inferer = Sessions()  # the engine's own inference, as the server and replay do
        sessions = [inferer.infer("trace", r.hash_ids) for r in reqs]
        inferred = True
    cache = UnboundedCache() if trace.has_hashes else None
    out = []
    for r, t, session in zip(progress(reqs, len(reqs), "profiling"), trace.times_s, sessions,
                             strict=True):
        after = r.after
        out.append(Row(t, r.input_length, r.output_length, len(r.hash_ids),
                       None if cache is None else cache.lookup(r.hash_ids), session,
                       r.workload, None if after is None else after.kind,
                       None if after is None else after.tool))
    return out, inferred, cache


def profile_trace(trace: Trace, *, curve: bool = True,
                  policies: Sequence[str] = DEFAULT_POLICIES, points: int = DEFAULT_POINTS,
                  capacities: Sequence[int] | None = None, model: str = DEFAULT_MODEL,
                  kv_bytes_per_token: int | None = None, bin_s: float | None = None,
                  progress: Progress = no_progress, replay_progress: bool = False
                  ) -> tuple[Profile, list[Row]]:
    """The whole profile of ``trace`` (and its rows, for plots). With ``curve``
    and hashes, replays it at ``capacities`` (default: :func:`capacity_grid`)."""
    rows, inferred, cache = trace_rows(trace, progress)
    bt = MOONCAKE_BLOCK_TOKENS
    prof = profile_rows(rows, source=trace.path, fmt=trace.format, block_tokens=bt,
                        inferred=inferred, cache=cache, bin_s=bin_s, notes=[LATENCY_NOTE])
    if not curve or prof.reuse is None or cache is None or cache.distinct == 0:
        return prof, rows
    bpt = kv_bytes_per_token or model_kv(model).bytes_per_token
    name = model if kv_bytes_per_token is None else f"{kv_bytes_per_token:,} B/token"
    caps = list(capacities) if capacities else capacity_grid(cache.distinct, points)
    cur = measure_curve(trace.requests, caps, policies, prof.reuse.unbounded_hit_rate,
                        block_bytes=bpt * bt, progress=replay_progress, bar=progress)
    size = sizing(cur, bt, name, bpt, trace.path)
    return replace(prof, curve=cur, sizing=size), rows
