from __future__ import annotations

import pytest
from kvstore.policies.base import TierSpec

from kvstore import policies

TIERS = [TierSpec("hbm", 1000)]


def test_every_baseline_is_registered() -> None:
    assert {"lru", "s3fifo", "lru+filter", "workload"} <= set(policies.available())


def test_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: .*lru"):
        policies.create("nope", TIERS)


def test_duplicates_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        policies.register("lru", "kvstore.policies.lru:LRUPolicy")


@pytest.mark.parametrize("name", policies.available())
def test_create_each(name: str) -> None:
    pol = policies.create(name, TIERS)
    assert pol.tiers[0].name == "hbm"
