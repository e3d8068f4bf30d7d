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


def test_create_hands_each_policy_the_config_it_names() -> None:
    from kvstore.policies.cost import CostModel
    from kvstore.policies.workload import WorkloadPolicy

    cost = CostModel(prefill_tokens_per_s=1234.0)
    pol = policies.create("workload", TIERS, cost=cost, hbm_keep_max_s=3.0, margin=2.0)
    assert isinstance(pol, WorkloadPolicy)
    assert (pol.cost, pol.hbm_keep_max_s, pol.margin) == (cost, 3.0, 2.0)
    assert policies.create("lru", TIERS, cost=cost).name == "lru"  # LRU takes no cost
    with pytest.raises(TypeError, match="small_fraction"):
        policies.create("lru", TIERS, small_fraction=0.2)  # an option LRU does not have


def test_a_wrapper_must_say_what_it_wraps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(policies._REGISTRY, "bare", "kvstore.policies.base:Wrapper")
    with pytest.raises(TypeError, match="wraps a policy"):
        policies.create("bare", TIERS)
    monkeypatch.setitem(policies._REGISTRY, "notone", "kvstore.policies.cost:CostModel")
    with pytest.raises(TypeError, match="not a Policy subclass"):
        policies.create("notone", TIERS)
