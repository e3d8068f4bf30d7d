"""How far the guard's ghosts are from what their policy really serves, in the served topology.

``AdaptivePolicy`` scores its bets as real prefix hits minus its LRU ghost's
(``kvstore.policies.lru_ghost.LRUGhost``), so its bound on the loss to LRU holds only
where the ghost counts what LRU serves. On named sessions the bets place blocks only
once their own ghost (``kvstore.policies.shadow.WorkloadGhost``) out-hits the LRU
ghost, so they prove themselves only as early as that ghost counts what they serve.

``--ghost lru`` (the default): LRU leads the whole trace (the guard's leader is
pinned to ``lru`` before and after every lookup, and the bank is unbounded), so the
score at the end is the LRU ghost's error: LRU's real prefix hits minus the ghost's,
in blocks (positive: the ghost counts LRU short, and the score flatters the bets).

``--ghost bets``: the bets lead and place named sessions' blocks the whole trace
(proven from the first lookup, never losing the lead), and their ghost is played on
every lookup that names a session; the error is the bets' real prefix hits minus
their ghost's over those lookups (positive: the ghost counts the bets short, and they
prove themselves later than they win).

The generated kinds of ``scripts/replay_grid.py``'s served grid (engine cache 5% of a
trace's distinct blocks in front of DRAM 10 / 30 / 60%, the script's defaults)::

    PYTHONHASHSEED=0 .venv/bin/python scripts/ghost_error.py            # every kind
    PYTHONHASHSEED=0 .venv/bin/python scripts/ghost_error.py --kinds reasoning,retained
    PYTHONHASHSEED=0 .venv/bin/python scripts/ghost_error.py --ghost bets --kinds reasoning
    PYTHONHASHSEED=0 .venv/bin/python scripts/ghost_error.py --ghost bets \
        --trace ../shared/traces/weka/claude_code_agent_trace.jsonl.gz  # engine 500, first 5,000

A diagnostic of the policy's internals (it reaches into the guard), not a benchmark of
the policy.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstore.policies.cost import CostModel

from kvstore.replay.driver import TierBudget
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.served import ServedReplay
from kvstore.replay.served_config import ServedConfig
from kvstore.replay.trace import Request, TraceError, load_trace

GHOSTS = ("lru", "bets")


def ghost_error(kind: str, seed: int, share: float, engine_share: float = 0.05,
                ghost: str = "lru") -> tuple[int, float, int]:
    """(DRAM blocks, the ghost's error in blocks, looked-up blocks) of one replay of a
    generated trace (``ghost``: which of the guard's ghosts, see the module's docstring)."""
    reqs = generate(kind, GenConfig(120, 1800.0, seed, 0.1))
    distinct = len({h for r in reqs for h in r.hash_ids})
    engine = round(engine_share * distinct)
    cap = max(4, round(share * distinct))
    error, looked = replay_error(reqs, engine, cap, ghost)
    return cap, error, looked


def replay_error(reqs: Sequence[Request], engine_blocks: int, dram_blocks: int,
                 ghost: str = "lru") -> tuple[float, int]:
    """(the ghost's error in blocks, looked-up blocks) of one served replay: an engine
    cache of ``engine_blocks`` (a quarter of it the holds' budget, as ``kvstore
    replay`` gives) in front of DRAM ``dram_blocks``."""
    if ghost not in GHOSTS:
        raise ValueError(f"ghost must be one of {GHOSTS}, got {ghost!r}")
    cfg = ServedConfig(engine_blocks, (TierBudget("dram", dram_blocks),), engine_blocks // 4)
    run = ServedReplay(reqs, "adaptive", cfg, CostModel(), {"bank": 1e12})
    pol: Any = run.engine.policy.inner
    on_request = pol.on_request
    if ghost == "lru":
        def pinned(req: Any, now: float) -> Any:
            pol.leader, pol._left = "lru", float("inf")
            plan = on_request(req, now)
            pol.leader, pol._left = "lru", float("inf")
            return plan

        pol.on_request = pinned
        res = asyncio.run(run.run())
        return pol.advantage, res.lookups
    # The bets lead and are proven throughout; their ghost plays every named lookup
    # (the guard plays it only while they are not proven: it is told they are not,
    # and told again after each lookup that they are).
    served = shown = 0
    score = pol._score

    def scored(req: Any, now: float) -> None:
        nonlocal served, shown
        wghost = pol._wghost
        before = wghost.hits if wghost is not None else 0
        pol.proven = False
        score(req, now)
        pol.proven = True
        if req.session_named and pol._wghost is not None:
            served += pol._served(req)
            shown += pol._wghost.hits - before

    def bets_lead(req: Any, now: float) -> Any:
        pol.leader, pol._left = "bets", float("inf")
        plan = on_request(req, now)
        pol.leader, pol._left = "bets", float("inf")
        return plan

    pol._score, pol.on_request = scored, bets_lead
    res = asyncio.run(run.run())
    return served - shown, res.lookups


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ghost", choices=GHOSTS, default="lru",
                   help="the LRU ghost (default) or the bets' own ghost")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--first-seed", type=int, default=11)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--shares", default="0.1,0.3,0.6")
    p.add_argument("--trace", help="a trace file instead of the generated kinds (with "
                   "--engine-blocks, --dram-blocks, --limit)")
    p.add_argument("--engine-blocks", type=int, default=500)
    p.add_argument("--dram-blocks", default="1000,2000,5000")
    p.add_argument("--limit", type=int, default=5000)
    args = p.parse_args(argv)
    print("| trace | seed | DRAM blocks | looked-up blocks | ghost error, blocks | points |")
    print("|---|---|---|---|---|---|")
    if args.trace:
        try:
            reqs = load_trace(args.trace)[:args.limit or None]
            caps = [int(c) for c in args.dram_blocks.split(",")]
        except (OSError, TraceError, ValueError) as exc:
            print(f"ghost_error: {exc}", file=sys.stderr)
            return 2
        for cap in caps:
            err, looked = replay_error(reqs, args.engine_blocks, cap, args.ghost)
            print(f"| {Path(args.trace).name} | - | {cap} | {looked} | {err:+.0f} "
                  f"| {100 * err / max(looked, 1):+.2f} |", flush=True)
        return 0
    for kind in args.kinds.split(","):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for share in (float(s) for s in args.shares.split(",")):
                cap, err, looked = ghost_error(kind, seed, share, ghost=args.ghost)
                print(f"| {kind} | {seed} | {cap} | {looked} | {err:+.0f} "
                      f"| {100 * err / max(looked, 1):+.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
