"""Synthetic workloads in the trace format, with sessions and turn hints.

Parameters follow published figures (see DESIGN.md section 1):

* agent: median 15 calls per session, ~126k-token prefixes (a shared system
  prompt and tool schema first) growing by ~1k tokens per step; the gap after
  a step is the latency of the tool it called, per tool.
* chat: human turn gaps of minutes (Mooncake conversation trace: p10 42 s,
  p50 2 min, p90 8 min), a few turns per session, a shared system prompt.
* rag: one-shot questions over a shared prompt plus popular (Zipf) documents.
* reasoning: few turns, long outputs, minutes between turns.
* batch: one request per job, never back.
* autocomplete: bursts of requests a second apart on a growing prefix; every
  other request is cancelled, so its tail block is never reused.
* retained: six agent apps, each with its own system prompt and tool schemas
  (16k tokens) that its harness marks for an hour (``cache_ttl_s`` 3600 up to the end
  of the shared prefix, as ``cache_control`` does); people pace the sessions (minutes
  between turns) and each brings a long document of its own, so between two uses of
  one app's prefix the other traffic ages it out of LRU. Not in ``mixed``.
* agent-noisy: agents whose hints predict little (latency independent of the tool's
  name, 24 tool names, a long tail of minutes and hours): the
  other kinds match the workload policy's classes (one lognormal per tool), this one
  does not. Not in ``mixed``.

``scale`` shrinks every length (1.0 = the published sizes) so tests stay small.
Everything is drawn from one seeded generator: the same arguments give the
same trace.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from kvstore.replay.trace import After, Request

__all__ = ["KINDS", "GenConfig", "generate"]

BLOCK = 512

#: Tool latency distributions (median seconds, lognormal sigma).
TOOLS: dict[str, tuple[float, float]] = {
    "search": (1.5, 0.5), "python": (4.0, 0.7), "browser": (12.0, 0.6), "shell": (0.8, 0.4),
}


@dataclass(frozen=True, slots=True)
class GenConfig:
    sessions: int = 200
    duration_s: float = 3600.0
    seed: int = 0
    scale: float = 1.0


class _Gen:
    def __init__(self, cfg: GenConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.ids = itertools.count(1)
        self.shared: dict[str, list[int]] = {}
        self.out: list[Request] = []
        self.sid = itertools.count()

    def blocks(self, tokens: float) -> int:
        return max(1, round(tokens * self.cfg.scale / BLOCK))

    def fresh(self, n: int) -> list[int]:
        return [next(self.ids) for _ in range(n)]

    def prefix(self, name: str, tokens: float) -> list[int]:
        if name not in self.shared:
            self.shared[name] = self.fresh(self.blocks(tokens))
        return list(self.shared[name])

    def lognormal(self, median: float, sigma: float) -> float:
        return median * math.exp(self.rng.gauss(0.0, sigma))

    def start(self) -> float:
        return self.rng.uniform(0.0, self.cfg.duration_s)

    def emit(self, t: float, chain: list[int], workload: str, session: str,
             after: After | None, output: int = 300, cache_ttl_s: float | None = None,
             cache_blocks: int | None = None) -> None:
        partial = self.rng.randint(1, BLOCK - 1)
        hash_ids = (*chain, next(self.ids))
        self.out.append(Request(int(t * 1000), len(chain) * BLOCK + partial, output,
                                hash_ids, session, workload, after, cache_ttl_s=cache_ttl_s,
                                cache_blocks=cache_blocks))

    def session(self, kind: str) -> str:
        return f"{kind}-{next(self.sid)}"


def _chat(g: _Gen) -> None:
    s = g.session("chat")
    t = g.start()
    chain = g.prefix("chat-system", 2048) + g.fresh(g.blocks(g.rng.uniform(500, 3000)))
    turns = 1 + min(30, int(g.rng.expovariate(1 / 4.0)))
    for i in range(turns):
        last = i == turns - 1
        g.emit(t, chain, "chat", s, After("end") if last else After("user"))
        t += g.lognormal(120.0, 0.9)  # p10 ~38 s, p90 ~380 s
        chain = chain + g.fresh(g.blocks(g.rng.uniform(300, 1500)))


def _agent(g: _Gen) -> None:
    s = g.session("agent")
    t = g.start()
    chain = g.prefix("agent-system", 8192) + g.prefix("agent-tools", 16384)
    chain = chain + g.fresh(g.blocks(126_000 - 24_576))
    steps = max(2, round(g.lognormal(15.0, 0.6)))
    for i in range(steps):
        if i == steps - 1:
            g.emit(t, chain, "agent", s, After("end"), 200)
            break
        tool = g.rng.choice(sorted(TOOLS))
        g.emit(t, chain, "agent", s, After("tool_call", tool), 200)
        median, sigma = TOOLS[tool]
        t += 2.0 + g.lognormal(median, sigma)  # decode time + tool latency
        chain = chain + g.fresh(g.blocks(1000))


def _rag(g: _Gen) -> None:
    s = g.session("rag")
    t = g.start()
    docs = [min(200, int(g.rng.paretovariate(1.2))) for _ in range(3)]
    chain = g.prefix("rag-system", 1024)
    path = "rag"
    for d in docs:
        # Block ids are prefix-chained: a document shares blocks only after the same prefix.
        path = f"{path}/{d}"
        chain = chain + g.prefix(path, 2048)
    chain = chain + g.fresh(g.blocks(300))
    g.emit(t, chain, "rag", s, After("end"), 200)


def _reasoning(g: _Gen) -> None:
    s = g.session("reasoning")
    t = g.start()
    chain = g.prefix("reasoning-system", 1024) + g.fresh(g.blocks(g.rng.uniform(500, 4000)))
    turns = 1 + min(5, int(g.rng.expovariate(1 / 1.5)))
    for i in range(turns):
        last = i == turns - 1
        g.emit(t, chain, "reasoning", s, After("end") if last else After("user"), 4000)
        t += 60.0 + g.lognormal(180.0, 0.8)
        chain = chain + g.fresh(g.blocks(g.rng.uniform(500, 2000)))


def _batch(g: _Gen) -> None:
    s = g.session("batch")
    chain = g.prefix("batch-template", 1024) + g.fresh(g.blocks(g.rng.uniform(2000, 8000)))
    g.emit(g.start(), chain, "batch", s, After("end"), 500)


def _autocomplete(g: _Gen) -> None:
    s = g.session("autocomplete")
    t = g.start()
    chain = g.prefix("autocomplete-system", 1024) + g.fresh(g.blocks(g.rng.uniform(2000, 6000)))
    n = 2 + int(g.rng.expovariate(1 / 10.0))
    for i in range(n):
        last = i == n - 1
        g.emit(t, chain, "autocomplete", s, After("end") if last else After("user"), 30)
        t += g.lognormal(1.0, 0.5)
        if i % 2 == 1:  # a kept completion extends the prefix; a cancelled one does not
            chain = chain + g.fresh(1)


def _retained(g: _Gen) -> None:
    s = g.session("retained")
    t = g.start()
    app = g.rng.randrange(6)
    shared = g.prefix(f"retained-system-{app}", 4096) + g.prefix(f"retained-tools-{app}", 12288)
    chain = shared + g.fresh(g.blocks(g.rng.uniform(16000, 48000)))
    turns = 1 + min(10, int(g.rng.expovariate(1 / 3.0)))
    for i in range(turns):
        last = i == turns - 1
        g.emit(t, chain, "chat", s, After("end") if last else After("user"),
               cache_ttl_s=3600.0, cache_blocks=len(shared))
        t += g.lognormal(120.0, 0.9)
        chain = chain + g.fresh(g.blocks(g.rng.uniform(1000, 4000)))


def _agent_noisy(g: _Gen) -> None:
    """An agent whose hints predict little: the opposite of ``agent``'s per-tool classes.
    A call's latency does not depend on its tool's name (one mixture for all: 60%
    seconds, 25% minutes, as a build or a person approving the call, 15% an hour,
    past most traces' end); tool names come from a set of 24, more than a class needs;
    and prefixes vary in length (8k-128k tokens)."""
    s = g.session("agent")
    t = g.start()
    chain = g.prefix("agent-system", 8192)
    chain = chain + g.fresh(g.blocks(g.rng.uniform(0, 120_000)))
    steps = max(2, round(g.lognormal(10.0, 0.9)))
    for i in range(steps):
        if i == steps - 1:
            g.emit(t, chain, "agent", s, After("end"), 200)
            break
        tool = f"tool{g.rng.randrange(24)}"
        g.emit(t, chain, "agent", s, After("tool_call", tool), 200)
        u = g.rng.random()
        gap = (g.lognormal(3.0, 0.8) if u < 0.6 else g.lognormal(120.0, 0.7) if u < 0.85
               else g.lognormal(3600.0, 0.5))
        t += 2.0 + gap
        chain = chain + g.fresh(g.blocks(g.rng.uniform(200, 3000)))


_KIND_FN: dict[str, Callable[[_Gen], None]] = {
    "chat": _chat, "agent": _agent, "rag": _rag, "reasoning": _reasoning,
    "batch": _batch, "autocomplete": _autocomplete, "retained": _retained,
    "agent-noisy": _agent_noisy,
}
#: Share of sessions per kind in ``mixed``.
MIX = {"chat": 0.3, "agent": 0.25, "rag": 0.15, "reasoning": 0.1, "batch": 0.1,
       "autocomplete": 0.1}
KINDS = (*_KIND_FN, "mixed")


def generate(kind: str, cfg: GenConfig | None = None) -> list[Request]:
    """Generate a trace of ``cfg.sessions`` sessions of ``kind`` (or ``mixed``)."""
    cfg = cfg or GenConfig()
    if kind not in KINDS:
        raise ValueError(f"unknown workload kind {kind!r}; valid: {', '.join(KINDS)}")
    if cfg.sessions < 1 or cfg.duration_s <= 0 or cfg.scale <= 0:
        raise ValueError("sessions must be >= 1, duration_s and scale > 0")
    g = _Gen(cfg)
    kinds = sorted(MIX)
    weights = [MIX[k] for k in kinds]
    for _ in range(cfg.sessions):
        k = g.rng.choices(kinds, weights)[0] if kind == "mixed" else kind
        _KIND_FN[k](g)
    g.out.sort(key=lambda r: r.timestamp_ms)
    return g.out
