"""The default policy's CPU per Lookup of 1,000 blocks, the policy alone (issue 25).

What the engine's Lookup asks of ``AdaptivePolicy`` (``on_request`` then
``on_access_many`` for the hits, tail first), timed as thread CPU: all 1,000 stored
(``hit``), or the first 500 stored and 500 new ones each call (``half``); the session
named or not (unnamed traffic also plays the reuse counts' ghost). One DRAM tier of
4,000 blocks. ``kvstore bench-loop`` times the whole servicer Lookup.

``--halving``: the Lookup that ages the reuse counts (every ``reset`` capacities looked
up), at scale: 100,000 blocks stored, unnamed lookups of 500 of them and 500 new keys
until the counts halve; its CPU against the other Lookups' p50 and p99 (the loop is
held that long, every other call waiting). The cyclic collector is off meanwhile
(``kvstore serve`` keeps it from walking the heap by freezing it: ``server.gc_freeze_s``):
else its passes over the keys the Lookups made, not the policy, make the p99.

    python scripts/bench_policy_lookup.py          # the four cases, p50 and min
    python scripts/bench_policy_lookup.py --halving
"""

from __future__ import annotations

import gc
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


def halving(stored_n: int = 100_000) -> dict[str, float]:
    pol = AdaptivePolicy([TierSpec("dram", stored_n * B)], CostModel())
    stored = [("ns", i) for i in range(stored_n)]
    pol.on_insert_many([BlockInfo(k, B) for k in stored], "dram", 0.0)
    cpu: list[float] = []
    halved_at = -1
    i = 0
    gc.collect()
    gc.disable()
    while halved_at < 0 or i < halved_at + 50:
        base = (i * 500) % (stored_n - 500)
        ks = stored[base:base + 500] + [("t", i, j) for j in range(500)]
        req = RequestInfo(ks, ["dram"] * 500 + [None] * 500, "anon", "chat", B, 16, 16,
                          session_named=False)
        counts = pol.freq.counts
        halvings, before = (counts.halvings, len(counts)) if counts is not None else (0, 0)
        t = time.thread_time()
        pol.on_request(req, float(i))
        pol.on_access_many(ks[499::-1], ["dram"] * 500, float(i))
        cpu.append(time.thread_time() - t)
        assert pol.freq.counts is not None
        if pol.freq.counts.halvings != halvings:
            halved_at = i
            tracked = before
        i += 1
    gc.enable()
    rest = sorted(cpu[:halved_at] + cpu[halved_at + 1:])
    return {"lookups": i, "tracked": tracked, "halving_ms": cpu[halved_at] * 1e3,
            "p50_ms": rest[len(rest) // 2] * 1e3, "p99_ms": rest[int(len(rest) * 0.99)] * 1e3}


def main() -> int:
    if "--halving" in sys.argv[1:]:
        r = halving()
        print(f"the Lookup that halves the counts (100,000 blocks stored, "
              f"{r['tracked']:,} keys counted before it, load {os.getloadavg()[0]:.2f}): "
              f"{r['halving_ms']:.1f} ms of policy CPU; the other {r['lookups'] - 1:,} "
              f"Lookups p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms")
        return 0
    print(f"policy CPU per Lookup of 1,000 blocks (load {os.getloadavg()[0]:.2f}):")
    for mode in ("hit", "half"):
        for named in (True, False):
            p50, low = run(mode, named)
            print(f"  {mode:4} {'named' if named else 'unnamed':7} p50 {p50:7.1f} us "
                  f"(min {low:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
