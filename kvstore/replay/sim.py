"""Trace replay through the same policy objects the server uses (in-process).

Per request, in timestamp order: look up its blocks (a prefix stops at its
first miss, or at the first block whose tier would lose to recompute under the
cost model), tell the policy (``on_lookup``), promote the served prefix into
the fastest tier, then touch or store every block from the last to the first
(vLLM's free order, so a parent is always fresher than its child). Blocks of
the request in flight are protected from eviction. If the request carries
``after``, the policy gets it as a hint right after the request, with the
session's blocks; the time of the next request is never shown.

The model is exclusive: a block sits in one tier at a time. Capacities are in
blocks of ``CostModel.block_bytes``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from kvstore.policies.base import BlockInfo, Hint, Move, Policy, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.replay.sessions import SessionInferer
from kvstore.replay.trace import Request

__all__ = ["DEFAULT_BANDWIDTH", "ReplayResult", "Simulator", "TierBudget", "tier_specs"]

#: Read bandwidth into the engine per tier name, bytes/s (HBM: already there).
DEFAULT_BANDWIDTH = {"hbm": 1e13, "dram": 25e9, "disk": 3e9}

_HINT_EVENT = {"tool_call": "tool_call", "user": "turn_end", "end": "session_end"}


@dataclass(frozen=True, slots=True)
class TierBudget:
    name: str
    blocks: int
    read_bytes_per_s: float


def tier_specs(budgets: Sequence[TierBudget], cost: CostModel) -> list[TierSpec]:
    return [TierSpec(b.name, b.blocks * cost.block_bytes, b.read_bytes_per_s) for b in budgets]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    policy: str
    tiers: dict[str, int]
    requests: int
    lookups: int
    hit_blocks: int
    hit_rate: float
    hit_rate_by_tier: dict[str, float]
    bytes_moved: dict[str, int]
    prefill_s_saved: float
    prefill_s_total: float
    elapsed_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy, "tiers": self.tiers, "requests": self.requests,
            "lookups": self.lookups, "hit_blocks": self.hit_blocks, "hit_rate": self.hit_rate,
            "hit_rate_by_tier": self.hit_rate_by_tier, "bytes_moved": self.bytes_moved,
            "prefill_s_saved": self.prefill_s_saved, "prefill_s_total": self.prefill_s_total,
            "elapsed_s": self.elapsed_s,
        }


class Simulator:
    """Exclusive multi-tier cache driven by one policy."""

    def __init__(self, policy: Policy, budgets: Sequence[TierBudget],
                 cost: CostModel | None = None, name: str = "") -> None:
        self.policy = policy
        self.cost = cost or CostModel()
        self.name = name or policy.name
        self.budgets = tuple(budgets)
        self.specs = tier_specs(budgets, self.cost)
        self._cap = [b.blocks * self.cost.block_bytes for b in budgets]
        self._use = [0] * len(budgets)
        self._names = [b.name for b in budgets]
        self._idx = {n: i for i, n in enumerate(self._names)}
        self._worth = [self.cost.worth_loading(s) for s in self.specs]
        self._saved = [self.cost.saved_s(s) for s in self.specs]
        self.loc: dict[Hashable, int] = {}
        self.info: dict[Hashable, BlockInfo] = {}
        self._sessions = SessionInferer()
        self.hits_by_tier = [0] * len(budgets)
        self.lookups = 0
        self.requests = 0
        self.moved: dict[str, int] = {}
        self.saved_s = 0.0
        self.total_s = 0.0

    # -- placement ------------------------------------------------------------
    def _move_bytes(self, src: str, dst: str, nbytes: int) -> None:
        k = f"{src}->{dst}"
        self.moved[k] = self.moved.get(k, 0) + nbytes

    def _remove(self, key: Hashable, t: int) -> None:
        del self.loc[key]
        self._use[t] -= self.info[key].size
        self.policy.on_remove(key, self._names[t])

    def _place(self, info: BlockInfo, t: int, protected: set[Hashable], now: float) -> bool:
        """Store ``info`` in tier ``t``, evicting (and demoting) as the policy says."""
        size = info.size
        if size > self._cap[t]:
            return False
        need = self._use[t] + size - self._cap[t]
        if need > 0:
            victims = self.policy.evict(self._names[t], need, protected, now)
            if victims is None:
                return False
            for v in victims:
                if self.loc.get(v) != t or v in protected:
                    raise RuntimeError(f"policy {self.name} chose an invalid victim {v!r}")
                vinfo = self.info[v]
                self._remove(v, t)
                dst = self.policy.demote_to(v, self._names[t], now)
                if dst is not None and self._idx[dst] > t and self._place(
                    vinfo, self._idx[dst], protected, now
                ):
                    self._move_bytes(self._names[t], dst, vinfo.size)
                else:
                    self.info.pop(v, None)
            if self._use[t] + size > self._cap[t]:
                raise RuntimeError(f"policy {self.name} freed too little in {self._names[t]}")
        self.loc[info.key] = t
        self.info[info.key] = info
        self._use[t] += size
        self.policy.on_insert(info, self._names[t], now)
        return True

    def _apply(self, moves: Iterable[Move], protected: set[Hashable], now: float) -> None:
        for mv in moves:
            t = self.loc.get(mv.key)
            if t is None or self._names[t] != mv.src:
                continue
            info = self.info[mv.key]
            self._remove(mv.key, t)
            if mv.dst is None:
                del self.info[mv.key]
                continue
            d = self._idx[mv.dst]
            if self._place(info, d, protected | {mv.key}, now):
                self._move_bytes(mv.src, mv.dst, info.size)
            elif not self._place(info, t, protected, now):
                del self.info[mv.key]

    # -- one request ------------------------------------------------------------
    def step(self, req: Request) -> int:
        """Replay one request; returns its prefix-hit blocks."""
        keys = req.hash_ids
        n = len(keys)
        now = req.timestamp_ms / 1000.0
        session = req.session_id or self._sessions.session_for(keys)
        workload = req.workload or "unknown"
        loc = self.loc
        tiers: list[str | None] = []
        served = 0
        stopped = False
        for k in keys:
            t = loc.get(k)
            tiers.append(None if t is None else self._names[t])
            if not stopped and t is not None and self._worth[t]:
                served += 1
                self.hits_by_tier[t] += 1
                self.saved_s += self._saved[t]
            else:
                stopped = True
        self.lookups += n
        self.requests += 1
        self.total_s += self.cost.recompute_s(n * self.cost.block_tokens)
        cost = self.cost
        last_tokens = req.input_length - (n - 1) * cost.block_tokens
        req_info = BlockInfo(keys[-1] if keys else None, cost.block_bytes, None, session,
                             workload, last_tokens, n)
        protected: set[Hashable] = set(keys)
        self._apply(self.policy.on_lookup(keys, tiers, req_info, now), protected, now)
        policy = self.policy
        for j in range(n - 1, -1, -1):
            k = keys[j]
            t = loc.get(k)
            if t is not None:
                if t > 0 and j < served:
                    info = self.info[k]
                    self._remove(k, t)
                    if self._place(info, 0, protected, now):
                        self._move_bytes(self._names[t], self._names[0], info.size)
                        continue
                    if not self._place(info, t, protected, now):
                        del self.info[k]
                        continue
                policy.on_access(k, self._names[loc[k]], now)
                continue
            ntok = cost.block_tokens if j < n - 1 else max(1, last_tokens)
            info = BlockInfo(k, cost.block_bytes, keys[j - 1] if j else None, session,
                             workload, ntok, n)
            dst = policy.admit(info, now)
            if dst is not None:
                self._place(info, self._idx[dst], protected, now)
        if req.after is not None:
            hint = Hint(session, _HINT_EVENT[req.after.kind], workload, req.after.tool)
            held = [(k, self._names[loc[k]]) for k in keys if k in loc]
            self._apply(policy.on_hint(hint, held, now), set[Hashable](), now)
        return served

    def run(self, requests: Sequence[Request],
            progress: Callable[[int], None] | None = None) -> ReplayResult:
        start = time.perf_counter()
        for i, req in enumerate(requests):
            self.step(req)
            if progress is not None and (i & 255) == 255:
                progress(256)
        if progress is not None:
            progress(len(requests) & 255)
        return self.result(time.perf_counter() - start)

    def result(self, elapsed_s: float = 0.0) -> ReplayResult:
        hits = sum(self.hits_by_tier)
        lk = max(self.lookups, 1)
        return ReplayResult(
            policy=self.name,
            tiers={b.name: b.blocks for b in self.budgets},
            requests=self.requests,
            lookups=self.lookups,
            hit_blocks=hits,
            hit_rate=hits / lk,
            hit_rate_by_tier={n: h / lk for n, h in zip(self._names, self.hits_by_tier,
                                                          strict=True)},
            bytes_moved=dict(sorted(self.moved.items())),
            prefill_s_saved=self.saved_s,
            prefill_s_total=self.total_s,
            elapsed_s=elapsed_s,
        )
