"""How far the guard's LRU ghost is from what LRU really serves, in the served topology.

``AdaptivePolicy`` scores its bets as real prefix hits minus its LRU ghost's
(``kvstore.policies.guard.LRUGhost``), so its bound on the loss to LRU holds only
where the ghost counts what LRU serves. Here LRU leads the whole trace (the guard's
leader is pinned to ``lru`` before and after every lookup, and the bank is unbounded),
so the score at the end is the ghost's error: LRU's real prefix hits minus the ghost's,
in blocks (positive: the ghost counts LRU short, and the score flatters the bets).
The generated kinds of ``scripts/replay_grid.py``'s served grid (engine cache 5% of a
trace's distinct blocks in front of DRAM 10 / 30 / 60%, the script's defaults)::

    PYTHONHASHSEED=0 .venv/bin/python scripts/ghost_error.py            # every kind
    PYTHONHASHSEED=0 .venv/bin/python scripts/ghost_error.py --kinds reasoning,retained

A diagnostic of the policy's internals (it reaches into the guard), not a benchmark of
the policy.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from kvstore.policies.cost import CostModel

from kvstore.replay.driver import TierBudget
from kvstore.replay.generate import KINDS, GenConfig, generate
from kvstore.replay.served import ServedReplay
from kvstore.replay.served_config import ServedConfig


def ghost_error(kind: str, seed: int, share: float, engine_share: float = 0.05
                ) -> tuple[int, float, int]:
    """(DRAM blocks, the ghost's error in blocks, looked-up blocks) of one replay."""
    reqs = generate(kind, GenConfig(120, 1800.0, seed, 0.1))
    distinct = len({h for r in reqs for h in r.hash_ids})
    engine = round(engine_share * distinct)
    cap = max(4, round(share * distinct))
    cfg = ServedConfig(engine, (TierBudget("dram", cap),), engine // 4)
    run = ServedReplay(reqs, "adaptive", cfg, CostModel(), {"bank": 1e12})
    pol: Any = run.engine.policy.inner
    on_request = pol.on_request

    def lru_leads(req: Any, now: float) -> Any:
        pol.leader, pol._left = "lru", float("inf")
        plan = on_request(req, now)
        pol.leader, pol._left = "lru", float("inf")
        return plan

    pol.on_request = lru_leads
    res = asyncio.run(run.run())
    return cap, pol.advantage, res.lookups


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--first-seed", type=int, default=11)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--shares", default="0.1,0.3,0.6")
    args = p.parse_args(argv)
    print("| kind | seed | DRAM blocks | looked-up blocks | ghost error, blocks | points |")
    print("|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for share in (float(s) for s in args.shares.split(",")):
                cap, err, looked = ghost_error(kind, seed, share)
                print(f"| {kind} | {seed} | {cap} | {looked} | {err:+.0f} "
                      f"| {100 * err / max(looked, 1):+.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
