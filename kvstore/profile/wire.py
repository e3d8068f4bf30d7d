"""The live profile on the wire: :class:`Profile` <-> ``ProfileResponse``.

The gRPC form carries every section a live profile has (no capacity curve or
sizing: those need the replay). Maps lose their order on the wire; decoding
restores the order the sections use.
"""

from __future__ import annotations

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.profile.dist import Dist
from kvstore.profile.model import Arrival, Lengths, Profile, Reuse, Sessions
from kvstore.profile.quadrants import QUADRANTS
from kvstore.profile.sessions import gap_order

__all__ = ["from_pb", "to_pb"]


def _pd(d: Dist) -> pb.Distribution:
    return pb.Distribution(count=d.count, mean=d.mean, p50=d.p50, p90=d.p90, p99=d.p99,
                           min=d.min, max=d.max)


def _d(d: Dist | None) -> pb.Distribution | None:
    return None if d is None else _pd(d)


def _fd(msg: pb.Distribution) -> Dist:
    return Dist(msg.count, msg.mean, msg.p50, msg.p90, msg.p99, msg.min, msg.max)


def _opt(msg: object, name: str) -> Dist | None:
    return _fd(getattr(msg, name)) if msg.HasField(name) else None  # type: ignore[attr-defined]


def to_pb(p: Profile) -> pb.ProfileResponse:
    ln, a = p.lengths, p.arrival
    msg = pb.ProfileResponse(
        window_seconds=p.window_s or 0.0, requests=p.requests, block_tokens=p.block_tokens,
        input_tokens=_d(ln.input_tokens), output_tokens=_d(ln.output_tokens),
        ratio=_d(ln.ratio), context_tokens=_d(ln.context_tokens), quadrants=ln.quadrants,
        workloads=ln.workloads, span_seconds=a.span_s,
        requests_per_minute=a.requests_per_minute, per_minute=_d(a.per_minute),
        bin_seconds=a.bin_s, bins=a.bins, peak=a.peak, trough=a.trough, notes=p.notes)
    if p.kv_bytes_per_token is not None:
        msg.kv_bytes_per_token = p.kv_bytes_per_token
    if p.retained_blocks is not None:
        msg.retained_blocks = p.retained_blocks
        msg.retained_came_back = p.retained_came_back or 0
    if a.peak_to_trough is not None:
        msg.peak_to_trough = a.peak_to_trough
    if a.interarrival_cv is not None:
        msg.interarrival_cv = a.interarrival_cv
    if p.reuse is not None:
        msg.reuse.CopyFrom(pb.ProfileReuse(block_lookups=p.reuse.block_lookups,
                                           hit_blocks=p.reuse.hit_blocks,
                                           unbounded_hit_rate=p.reuse.unbounded_hit_rate))
    s = p.sessions
    if s is not None:
        msg.sessions.CopyFrom(pb.ProfileSessions(
            sessions=s.sessions, calls_per_session=_d(s.calls_per_session),
            read_back_tokens=_d(s.read_back_tokens), new_tokens=_d(s.new_tokens),
            gap_seconds={k: _pd(v) for k, v in s.gaps_s.items()},
            duration_seconds=_d(s.duration_s)))
    return msg


def from_pb(msg: pb.ProfileResponse, source: str) -> Profile:
    quads = dict(msg.quadrants)
    order = [*QUADRANTS, *sorted(set(quads) - set(QUADRANTS))]
    lengths = Lengths(
        _opt(msg, "input_tokens"), _opt(msg, "output_tokens"), _opt(msg, "ratio"),
        _opt(msg, "context_tokens"), {q: quads.get(q, 0) for q in order},
        dict(sorted(msg.workloads.items(), key=lambda kv: (-kv[1], kv[0]))))
    arrival = Arrival(
        msg.span_seconds, msg.requests_per_minute, _opt(msg, "per_minute"), msg.bin_seconds,
        msg.bins, msg.peak, msg.trough,
        msg.peak_to_trough if msg.HasField("peak_to_trough") else None,
        msg.interarrival_cv if msg.HasField("interarrival_cv") else None)
    reuse = None
    if msg.HasField("reuse"):
        reuse = Reuse(msg.reuse.block_lookups, msg.reuse.hit_blocks,
                      msg.reuse.unbounded_hit_rate)
    sessions = None
    if msg.HasField("sessions"):
        s = msg.sessions
        gaps = gap_order(s.gap_seconds)
        sessions = Sessions(s.sessions, False, _opt(s, "calls_per_session"),
                            _opt(s, "read_back_tokens"), _opt(s, "new_tokens"),
                            {k: _fd(s.gap_seconds[k]) for k in gaps},
                            _opt(s, "duration_seconds"))
    return Profile(
        source=source, format="live", requests=msg.requests, lengths=lengths, arrival=arrival,
        reuse=reuse, sessions=sessions, block_tokens=msg.block_tokens, notes=tuple(msg.notes),
        window_s=msg.window_seconds,
        kv_bytes_per_token=msg.kv_bytes_per_token if msg.HasField("kv_bytes_per_token")
        else None,
        retained_blocks=msg.retained_blocks if msg.HasField("retained_blocks") else None,
        retained_came_back=(msg.retained_came_back if msg.HasField("retained_came_back")
                            else None))
