"""Traffic that names no session: the guarded policy learns per-block reuse.

A trace without session ids or hints (as a proxy forwarding bare prompts sends, or
the Mooncake conversation trace): popular documents, each looked up again long after
its last use (a reuse distance several times the tier), between one-off prompts that
are never reused. LRU keeps the newest blocks, so the one-off prompts push every
document out before it comes back; counting how often each block is looked up keeps
the documents and refuses the one-off prompts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest
from kvstore.policies.cost import CostModel

from kvstore.replay.driver import TierBudget
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.served import EngineModel, ServedConfig, replay_served
from kvstore.replay.trace import Request

BLOCK = 512


def sessionless_trace(seed: int = 0, steps: int = 600) -> list[Request]:
    """20 documents of 4 blocks (80 blocks), each request one document plus a question
    block of its own, every one followed by three one-off prompts of 8 blocks: about
    580 blocks are looked up between two uses of a document. No session ids, no hints."""
    rng = random.Random(seed)
    ids = iter(range(1, 1 << 30))
    docs = [tuple(next(ids) for _ in range(4)) for _ in range(20)]
    out: list[Request] = []
    t = 0
    for _ in range(steps):
        chain = (*rng.choice(docs), next(ids))
        out.append(Request(t, len(chain) * BLOCK, 10, chain))
        t += 100
        for _ in range(3):
            scan = tuple(next(ids) for _ in range(8))
            out.append(Request(t, len(scan) * BLOCK, 10, scan))
            t += 100
    return out


def hit_rate(reqs: list[Request], policy: str, blocks: int) -> float:
    cfg = ServedConfig(0, (TierBudget("dram", blocks),), 0, model=EngineModel.instant(),
                       decode_saves=False, trust_end=True, send_then=False)
    return asyncio.run(replay_served(reqs, policy, cfg, CostModel())).hit_rate


def test_sessionless_reuse_lru_cannot_keep() -> None:
    """At 100 blocks (the documents fit, the stream between two uses does not) LRU hits
    almost nothing (1.7%); the guarded default policy keeps the documents and hits
    within 1.5 points of every document block after its first use (the ceiling, 13.3%).
    Before it counted blocks, sessions inferred from prefixes left it at 9.0%."""
    reqs = sessionless_trace()
    lookups = sum(len(r.hash_ids) for r in reqs)
    docs = [r.hash_ids[:4] for r in reqs if len(r.hash_ids) == 5]
    ceiling = (4 * len(docs) - 4 * len(set(docs))) / lookups
    lru = hit_rate(reqs, "lru", 100)
    adaptive = hit_rate(reqs, "adaptive", 100)
    assert lru < 0.03, lru
    assert adaptive >= ceiling - 0.015, (adaptive, ceiling, lru)


def anonymous(reqs: list[Request]) -> list[Request]:
    """The same trace with no session named: every ``session_id``, ``workload`` and
    ``after`` removed (as a Mooncake-style trace; the engine infers the sessions)."""
    return [dataclasses.replace(r, session_id=None, workload=None, after=None) for r in reqs]


@pytest.mark.parametrize(("kind", "seed"), [("chat", 1), ("reasoning", 1)])
def test_sessionless_generated_kinds_never_below_lru(kind: str, seed: int) -> None:
    """Generated chat and reasoning traces (120 sessions, 30 minutes, scale 0.1) with no
    session named, the tier 15% of their distinct blocks: the bets on the sessions the
    engine inferred lost to LRU steadily (chat 55.42% against 59.15%, reasoning 42.19%
    against 47.17%) and the guard, with a slack of 2 capacities decayed over 16, never
    saw it. The guard's allowance now grows with the square root of the squared
    per-request differences (a few blocks here), and on inferred sessions LRU places the
    blocks unless the counts' ghost wins: within 0.2 points of LRU or above."""
    reqs = anonymous(generate(kind, GenConfig(120, 1800.0, seed, 0.1)))
    blocks = round(0.15 * len({h for r in reqs for h in r.hash_ids}))
    lru = hit_rate(reqs, "lru", blocks)
    adaptive = hit_rate(reqs, "adaptive", blocks)
    assert adaptive >= lru - 0.002, (adaptive, lru)
