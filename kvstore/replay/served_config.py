"""The served replay's configuration and result, and what a request's client sends.

:class:`EngineModel` (how long a request takes), :class:`ServedConfig` (the engine
cache, the sidecar's tiers, the holds, what the client says), :class:`ServedResult`
(one run's row), and the two facts of a request that are the trace's, not a policy's:
the ids of its decode blocks (:func:`decode_block_ids`) and the ``then`` / hint its
client sends (:func:`client_then`). The per-request path is
:mod:`kvstore.replay.node`, the event loop :mod:`kvstore.replay.served`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.replay.driver import TierBudget
from kvstore.replay.trace import Request
from kvstore.turns import AFTER_EVENTS, lookup_then

__all__ = ["DEFAULT_HOLD_MAX_S", "DEFAULT_MAX_RUNNING", "DEFAULT_TPOT_S", "SIDECAR_TIERS",
           "EngineModel", "ServedConfig", "ServedResult", "check_sidecar_tiers", "client_then",
           "decode_block_ids", "percentile", "sidecar_alone"]

#: Sidecar tiers of the served topology, fastest first (the GPU is the engine's).
SIDECAR_TIERS = ("dram", "disk", "redis")



def check_sidecar_tiers(budgets: Sequence[TierBudget]) -> None:
    """Refuse a sidecar tier that is not one of :data:`SIDECAR_TIERS` (the GPU is the
    engine's own cache, ``engine_blocks``, never a tier of the sidecar)."""
    for b in budgets:
        if b.name not in SIDECAR_TIERS:
            raise ValueError(f"sidecar tier {b.name!r}: one of {', '.join(SIDECAR_TIERS)}")


#: Defaults of the engine model and the keeps (the CLI's too).
DEFAULT_TPOT_S = 0.02
DEFAULT_MAX_RUNNING = 64
DEFAULT_HOLD_MAX_S = 10.0


@dataclass(frozen=True, slots=True)
class EngineModel:
    """How long a request takes in the engine (stated, not measured)."""

    #: Prefill throughput for the computed part of a prompt (default: the cost model's).
    prefill_tokens_per_s: float = 10_000.0
    #: Decode time per output token.
    time_per_output_token_s: float = DEFAULT_TPOT_S
    #: Most requests running at once (vLLM's ``max_num_seqs``).
    max_running: int = DEFAULT_MAX_RUNNING
    #: Tier bandwidths apply to loads and to the mover (False: both instant).
    timed_transfers: bool = True

    def __post_init__(self) -> None:
        if not self.prefill_tokens_per_s > 0 or self.time_per_output_token_s < 0:
            raise ValueError(f"engine model: prefill_tokens_per_s {self.prefill_tokens_per_s} "
                             f"must be > 0 and time_per_output_token_s "
                             f"{self.time_per_output_token_s} >= 0")
        if self.max_running < 1:
            raise ValueError(f"engine model: max_running must be >= 1, got {self.max_running}")

    @classmethod
    def instant(cls, max_running: int = 1) -> EngineModel:
        """Requests take no time and transfers are instant (the untimed replay)."""
        return cls(math.inf, 0.0, max_running, timed_transfers=False)


@dataclass(frozen=True, slots=True)
class ServedConfig:
    engine_blocks: int
    sidecar: tuple[TierBudget, ...]
    #: Most engine blocks the connector's keeps hold at once; 0: no holds.
    hold_budget_blocks: int
    #: Cap on one keep (the connector's ``hold_max_ms``).
    hold_max_s: float = DEFAULT_HOLD_MAX_S
    model: EngineModel = field(default_factory=EngineModel)
    decode_saves: bool = True
    trust_end: bool = False
    #: Lookups carry ``then`` / ``tool`` (False: the ablation without them).
    send_then: bool = True


def sidecar_alone(budgets: Sequence[TierBudget]) -> ServedConfig:
    """The sidecar's tiers behind no engine cache, untimed: no decode saves, the trace's
    ``end`` trusted, lookups without ``then`` (``--engine-blocks 0 --instant
    --no-decode-saves --trust-end --no-then``). The "sidecar DRAM alone" tables and the
    profile's capacity curves run this; on a trace whose blocks are all full it gives
    the figures of the untimed single-tier loop it replaced (tests/replay/test_served.py).
    """
    return ServedConfig(0, tuple(budgets), 0, model=EngineModel.instant(),
                        decode_saves=False, trust_end=True, send_then=False)


@dataclass(frozen=True, slots=True)
class ServedResult:
    policy: str
    engine_blocks: int
    tiers: dict[str, int]
    hold_budget_blocks: int
    requests: int
    lookups: int
    hit_blocks: int
    hit_rate: float
    hits_by_tier: dict[str, float]
    prefill_s_saved: float
    prefill_s_total: float
    ttft_p50_s: float
    ttft_p99_s: float
    after_tool_ttft_p50_s: float
    after_tool_ttft_p99_s: float
    after_tool_requests: int
    bytes_moved: dict[str, int]
    decode_blocks_saved: int
    holds_made: int
    holds_refused: int
    elapsed_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy, "engine_blocks": self.engine_blocks, "tiers": self.tiers,
            "hold_budget_blocks": self.hold_budget_blocks, "requests": self.requests,
            "lookups": self.lookups, "hit_blocks": self.hit_blocks, "hit_rate": self.hit_rate,
            "hits_by_tier": self.hits_by_tier, "prefill_s_saved": self.prefill_s_saved,
            "prefill_s_total": self.prefill_s_total, "ttft_p50_s": self.ttft_p50_s,
            "ttft_p99_s": self.ttft_p99_s, "after_tool_ttft_p50_s": self.after_tool_ttft_p50_s,
            "after_tool_ttft_p99_s": self.after_tool_ttft_p99_s,
            "after_tool_requests": self.after_tool_requests, "bytes_moved": self.bytes_moved,
            "decode_blocks_saved": self.decode_blocks_saved, "holds_made": self.holds_made,
            "holds_refused": self.holds_refused, "elapsed_s": self.elapsed_s,
        }


def decode_block_ids(requests: Sequence[Request], block_tokens: int) -> list[tuple[int, ...]]:
    """Per request, the ids of the full blocks its output tokens complete: the prompt's
    full blocks end at ``input_length // block_tokens``, the decode's at
    ``(input + output) // block_tokens``. Named by the session's next request where it
    repeats this one's full prompt blocks, else fresh ids above every trace id."""
    fresh = max((max(r.hash_ids) for r in requests if r.hash_ids), default=0) + 1
    nxt: dict[str, Request] = {}
    out: list[tuple[int, ...]] = [()] * len(requests)
    for i in range(len(requests) - 1, -1, -1):
        r = requests[i]
        n0 = r.input_length // block_tokens
        n1 = (r.input_length + r.output_length) // block_tokens
        n0 = min(n0, len(r.hash_ids))
        nreq = nxt.get(r.session_id) if r.session_id is not None else None
        if n1 > n0:
            named: tuple[int, ...] = ()
            if nreq is not None and nreq.hash_ids[:n0] == r.hash_ids[:n0]:
                named = nreq.hash_ids[n0:n1]
            ids = list(named)
            while len(ids) < n1 - n0:
                ids.append(fresh)
                fresh += 1
            out[i] = tuple(ids)
        if r.session_id is not None:
            nxt[r.session_id] = r
    return out


def client_then(req: Request, trust_end: bool = False) -> tuple[str, str]:
    """(hint event, tool) of what the request's client knows its turn ends with: the
    ``then`` / ``tool`` its lookup carries and the hint its end sends. A client that
    says nothing sends nothing, as the connector does (:mod:`kvstore.turns`; a trace's
    request carries no expected gap, so one without ``after`` is not described). The
    trace's ``end`` is a ``user`` turn unless ``trust_end``."""
    after = req.after
    kind = after.kind if after is not None else "user"
    if kind == "end" and not trust_end:
        kind = "user"
    then = lookup_then(AFTER_EVENTS[kind], after is not None)
    return then, (after.tool or "") if after is not None and then else ""


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return s[k]
