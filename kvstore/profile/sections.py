"""Every section of a profile from its rows (offline and live alike); the
capacity curve and the sizing, which need the replay, are added by
:mod:`kvstore.profile.report`."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.profile.arrival import arrival_stats
from kvstore.profile.lengths import length_stats
from kvstore.profile.model import Profile, Row
from kvstore.profile.reuse import UnboundedCache, reuse_stats
from kvstore.profile.sessions import session_stats

__all__ = ["profile_rows"]


def profile_rows(rows: Sequence[Row], *, source: str, fmt: str, block_tokens: int,
                 inferred: bool = False, cache: UnboundedCache | None = None,
                 bin_s: float | None = None, notes: Sequence[str] = (),
                 window_s: float | None = None, kv_bytes_per_token: float | None = None
                 ) -> Profile:
    """Every section but the curve and the sizing (which need the replay)."""
    reuse = reuse_stats(rows, cache)
    sessions = session_stats(rows, block_tokens, inferred)
    extra = list(notes)
    if reuse is None:
        extra.append("prefix reuse: cannot be computed: the trace carries no block hashes")
    if sessions is None:
        extra.append("sessions: none (no session ids, and no hashes to infer them from)")
        extra.append("request duration: not derivable (arrival times only, no sessions)")
    else:
        extra.append("request duration: not recorded; the gap to a session's next call "
                     "bounds it from above")
    return Profile(
        source=source, format=fmt, requests=len(rows), lengths=length_stats(rows),
        arrival=arrival_stats([r.t_s for r in rows], bin_s), reuse=reuse, sessions=sessions,
        block_tokens=block_tokens, notes=tuple(extra), window_s=window_s,
        kv_bytes_per_token=kv_bytes_per_token)
