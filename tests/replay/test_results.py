"""Result tables: runs with different tier sets share one table."""

from __future__ import annotations

from kvstore.replay.driver import ReplayResult
from kvstore.replay.results import format_table


def result(policy: str, tiers: dict[str, int], by_tier: dict[str, float]) -> ReplayResult:
    return ReplayResult(policy=policy, tiers=tiers, requests=10, lookups=100,
                        hit_blocks=int(100 * sum(by_tier.values())),
                        hit_rate=sum(by_tier.values()), hit_rate_by_tier=by_tier,
                        bytes_moved={"hbm->dram": 2_000_000_000}, prefill_s_saved=12.0,
                        prefill_s_total=50.0)


def test_a_tier_missing_from_the_first_run_still_gets_its_columns() -> None:
    two = result("lru", {"hbm": 10, "dram": 40}, {"hbm": 0.1, "dram": 0.05})
    three = result("lru", {"hbm": 10, "dram": 40, "disk": 200},
                   {"hbm": 0.1, "dram": 0.05, "disk": 0.2})
    lines = format_table([two, three], {250: 0.5}).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[:4] == ["policy", "hbm blocks", "dram blocks", "disk blocks"]
    assert "from disk" in head
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert rows[0][3] == "0" and rows[0][head.index("from disk")] == "0.00%"
    assert rows[1][3] == "200" and rows[1][head.index("from disk")] == "20.00%"
    assert rows[1][head.index("hit rate")] == "35.00%"
    assert rows[2][:2] == ["belady", "250"]
