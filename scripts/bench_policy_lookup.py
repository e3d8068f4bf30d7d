"""The default policy's CPU per Lookup of 1,000 blocks, the policy alone (issue 25).

What the engine's Lookup asks of ``AdaptivePolicy`` (``on_request`` then
``on_access_many`` for the hits, tail first), timed as thread CPU: all 1,000 stored
(``hit``), or the first 500 stored and 500 new ones each call (``half``); the session
named or not (unnamed traffic also plays the reuse counts' ghost). One DRAM tier of
4,000 blocks. ``kvstore bench-loop`` times the whole servicer Lookup.

    python scripts/bench_policy_lookup.py          # the four cases, p50 and min
"""

from __future__ import annotations

import os
import sys
import time

from kvstore.policies.adaptive import AdaptivePolicy
from kvstore.policies.base import BlockInfo, Plan, RequestInfo, TierSpec
from kvstore.policies.cost import CostModel

B = 4096


def run(mode: str, named: bool, calls: int = 300) -> tuple[float, float]:
    pol = AdaptivePolicy([TierSpec("dram", 4000 * B)], CostModel())
    keys = [("ns", i) for i in range(1000)]
    stored = keys if mode == "hit" else keys[:500]
    for j, k in enumerate(stored):
        pol.on_insert(BlockInfo(k, B, stored[j - 1] if j else None, "s", "chat", 16,
                                len(stored)), "dram", 0.0)

    def one(i: int) -> Plan:
        now = float(i)
        if mode == "hit":
            ks: list = keys
            tiers: list[str | None] = ["dram"] * 1000
        else:
            ks = keys[:500] + [("t", i, j) for j in range(500)]
            tiers = ["dram"] * 500 + [None] * 500
        req = RequestInfo(ks, tiers, "s" if named else "anon", "chat", B, 16, 16,
                          session_named=named)
        t = time.thread_time()
        plan = pol.on_request(req, now)
        n = len(stored) if mode == "hit" else 500
        pol.on_access_many(ks[n - 1::-1], ["dram"] * n, now)
        cpu.append(time.thread_time() - t)
        return plan

    cpu: list[float] = []
    for i in range(20):
        one(i)
    cpu.clear()
    for i in range(20, 20 + calls):
        one(i)
    cpu.sort()
    return cpu[len(cpu) // 2] * 1e6, cpu[0] * 1e6


def main() -> int:
    print(f"policy CPU per Lookup of 1,000 blocks (load {os.getloadavg()[0]:.2f}):")
    for mode in ("hit", "half"):
        for named in (True, False):
            p50, low = run(mode, named)
            print(f"  {mode:4} {'named' if named else 'unnamed':7} p50 {p50:7.1f} us "
                  f"(min {low:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
