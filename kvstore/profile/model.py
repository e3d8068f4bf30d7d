"""What a profile is made of: one :class:`Row` per request in, one
:class:`Profile` (a frozen dataclass per section) out.

Offline profiles build rows from a trace, the live profile from the requests
the server sees; both go through the same section functions, so the numbers
mean the same thing in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvstore.profile.dist import Dist

__all__ = ["Arrival", "Curve", "CurvePoint", "Lengths", "Profile", "Reuse", "Row", "Sessions",
           "Sizing", "Target"]


@dataclass(slots=True)
class Row:
    """One request as the profile sees it (mutable: a later hint fills ``after``)."""

    t_s: float
    input_tokens: int
    #: None when not observed (live traffic whose hints carry no output length).
    output_tokens: int | None
    #: Hashed blocks looked up (0 when the trace has no hashes).
    blocks: int = 0
    #: Leading blocks an unbounded cache would have held; None without hashes.
    hit_blocks: int | None = None
    session: str | None = None
    workload: str | None = None
    #: What followed this request: ``tool_call``, ``user`` or ``end`` (None: not said).
    after: str | None = None
    tool: str | None = None


def _dj(d: Dist | None) -> dict[str, float] | None:
    return None if d is None else d.to_json()


@dataclass(frozen=True, slots=True)
class Lengths:
    input_tokens: Dist | None
    output_tokens: Dist | None
    #: input / output tokens, over requests with output > 0.
    ratio: Dist | None
    #: input + output tokens: the context a request holds when it ends.
    context_tokens: Dist | None
    #: Requests per quadrant (see :mod:`kvstore.profile.quadrants`).
    quadrants: dict[str, int]
    #: Requests per workload class as the trace or client declared it.
    workloads: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"input_tokens": _dj(self.input_tokens), "output_tokens": _dj(self.output_tokens),
                "ratio": _dj(self.ratio), "context_tokens": _dj(self.context_tokens),
                "quadrants": self.quadrants, "workloads": self.workloads}



@dataclass(frozen=True, slots=True)
class Arrival:
    #: First to last request.
    span_s: float
    #: Requests / span, per minute.
    requests_per_minute: float
    #: Requests in each complete minute from the first request.
    per_minute: Dist | None
    #: Width of the bins peak and trough are counted in (3,600 s when the span
    #: holds at least 3 complete hours, else 60 s, unless chosen).
    bin_s: float
    #: Complete bins counted (a partial last bin would understate its count).
    bins: int
    peak: int
    trough: int
    #: peak / trough; None with fewer than 2 complete bins or an empty bin.
    peak_to_trough: float | None
    #: Burstiness: coefficient of variation of inter-arrival times (1 = Poisson,
    #: > 1 bursty, < 1 regular).
    interarrival_cv: float | None

    def to_json(self) -> dict[str, Any]:
        return {"span_s": self.span_s, "requests_per_minute": self.requests_per_minute,
                "per_minute": _dj(self.per_minute), "bin_s": self.bin_s, "bins": self.bins,
                "peak": self.peak, "trough": self.trough, "peak_to_trough": self.peak_to_trough,
                "interarrival_cv": self.interarrival_cv}



@dataclass(frozen=True, slots=True)
class Reuse:
    block_lookups: int
    #: Blocks an unbounded cache would have served (leading blocks seen before).
    hit_blocks: int
    unbounded_hit_rate: float
    #: Distinct blocks: what an unbounded cache ends up holding. None live.
    distinct_blocks: int | None = None
    #: Share of distinct blocks looked up only once (never reused). None live.
    single_use_share: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"block_lookups": self.block_lookups, "hit_blocks": self.hit_blocks,
                "unbounded_hit_rate": self.unbounded_hit_rate,
                "distinct_blocks": self.distinct_blocks,
                "single_use_share": self.single_use_share}



@dataclass(frozen=True, slots=True)
class Sessions:
    sessions: int
    #: True when sessions were inferred from prefix chains (no session ids).
    inferred: bool
    calls_per_session: Dist | None
    #: Per call after a session's first: tokens an unbounded cache would serve.
    read_back_tokens: Dist | None
    #: Per call after a session's first: tokens it adds (input - read back).
    new_tokens: Dist | None
    #: Seconds from a call to its session's next call, by what followed the
    #: earlier call: ``tool_call``, ``tool_call:<tool>``, ``user``, ``end``,
    #: ``unlabelled``.
    gaps_s: dict[str, Dist]
    #: First to last call of each session with at least two calls.
    duration_s: Dist | None

    def to_json(self) -> dict[str, Any]:
        return {"sessions": self.sessions, "inferred": self.inferred,
                "calls_per_session": _dj(self.calls_per_session),
                "read_back_tokens": _dj(self.read_back_tokens),
                "new_tokens": _dj(self.new_tokens),
                "gaps_s": {k: v.to_json() for k, v in self.gaps_s.items()},
                "duration_s": _dj(self.duration_s)}



@dataclass(frozen=True, slots=True)
class CurvePoint:
    policy: str
    blocks: int
    hit_rate: float


@dataclass(frozen=True, slots=True)
class Curve:
    """Hit rate against capacity (one tier of ``blocks``), per policy, from the
    replay; ``belady`` is the offline optimum at the same capacities."""

    points: tuple[CurvePoint, ...]
    unbounded_hit_rate: float

    def policies(self) -> list[str]:
        return list(dict.fromkeys(p.policy for p in self.points))

    def of(self, policy: str) -> list[tuple[int, float]]:
        return sorted((p.blocks, p.hit_rate) for p in self.points if p.policy == policy)

    def to_json(self) -> dict[str, Any]:
        return {"unbounded_hit_rate": self.unbounded_hit_rate,
                "points": [{"policy": p.policy, "blocks": p.blocks, "hit_rate": p.hit_rate}
                           for p in self.points]}


@dataclass(frozen=True, slots=True)
class Target:
    """The capacity that reaches ``share`` of the unbounded hit rate."""

    share: float
    tier: str
    hit_rate: float
    #: Fewest blocks any policy needs (None: no policy reached it on the grid).
    blocks: int | None
    gb: float | None
    policy: str | None
    #: Blocks the offline optimum needs (the bound).
    belady_blocks: int | None
    #: ``blocks`` (``belady_blocks``) is only an upper bound: the smallest
    #: capacity measured already reached the target.
    at_most: bool = False
    belady_at_most: bool = False


@dataclass(frozen=True, slots=True)
class Sizing:
    model: str
    kv_bytes_per_token: int
    block_tokens: int
    targets: tuple[Target, ...]
    toml: str

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "kv_bytes_per_token": self.kv_bytes_per_token,
                "block_tokens": self.block_tokens,
                "targets": [{"share": t.share, "tier": t.tier, "hit_rate": t.hit_rate,
                             "blocks": t.blocks, "gb": t.gb, "policy": t.policy,
                             "belady_blocks": t.belady_blocks, "at_most": t.at_most,
                             "belady_at_most": t.belady_at_most} for t in self.targets],
                "toml": self.toml}


@dataclass(frozen=True, slots=True)
class Profile:
    #: The trace path, or the server address for a live profile.
    source: str
    #: ``mooncake``, ``mooncake+sessions``, ``azure`` or ``live``.
    format: str
    requests: int
    lengths: Lengths
    arrival: Arrival
    reuse: Reuse | None
    sessions: Sessions | None
    #: Tokens per hashed block (512 in Mooncake traces; learned live).
    block_tokens: int
    #: What could not be computed, and why.
    notes: tuple[str, ...] = ()
    curve: Curve | None = None
    sizing: Sizing | None = None
    #: Live only: the window the statistics cover, and KV bytes per token seen.
    window_s: float | None = None
    kv_bytes_per_token: float | None = None
    #: Live only: distinct blocks clients retained (cache_ttl_s), and how many of them
    #: a lookup found while they were retained.
    retained_blocks: int | None = None
    retained_came_back: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "format": self.format, "requests": self.requests,
            "block_tokens": self.block_tokens, "window_s": self.window_s,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "lengths": self.lengths.to_json(), "latency_target": None,
            "arrival": self.arrival.to_json(),
            "reuse": None if self.reuse is None else self.reuse.to_json(),
            "sessions": None if self.sessions is None else self.sessions.to_json(),
            "curve": None if self.curve is None else self.curve.to_json(),
            "sizing": None if self.sizing is None else self.sizing.to_json(),
            "notes": list(self.notes),
        }
