from __future__ import annotations

import pytest
from kvstore.policies.base import BlockInfo, RequestInfo, TierSpec
from kvstore.policies.cost import CostModel
from kvstore.policies.filter import AdmissionFilter, FilteredLRU
from kvstore.policies.lru import LRUPolicy

from kvstore.engine.eviction import EvictionManager


def test_slow_tier_hit_that_loses_to_recompute_is_not_worth_it() -> None:
    # SGLang's measurement: an 8k-token file-tier hit took 2.45 s, recompute 1.73 s.
    cost = CostModel(prefill_tokens_per_s=8192 / 1.73, block_tokens=8192,
                     block_bytes=int(2.45 * 1e9))
    slow = TierSpec("file", 1 << 40, read_bytes_per_s=1e9)
    fast = TierSpec("dram", 1 << 40, read_bytes_per_s=25e9)
    assert not cost.worth_loading(slow)
    assert cost.saved_s(slow) == 0.0
    assert cost.worth_loading(fast)
    assert cost.saved_s(fast) == pytest.approx(1.73 - 2.45 / 25, rel=1e-6)


def test_cost_model_validates() -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        CostModel(prefill_tokens_per_s=0)


def test_filter_admits_after_threshold_lookups() -> None:
    tiers = [TierSpec("hbm", 1000)]
    pol = FilteredLRU(LRUPolicy(tiers), threshold=2)
    req = RequestInfo(["k"], [None], "s", "chat", 10, 16, 16)
    assert pol.on_request(req, 0.0).admit == {}
    assert pol.on_request(req, 1.0).admit == {"k": "hbm"}


def test_filter_wraps_any_policy_and_bounds_memory() -> None:
    tiers = [TierSpec("hbm", 1000)]
    inner = LRUPolicy(tiers)
    pol = AdmissionFilter(inner, threshold=1, max_tracked=3)
    pol.on_request(RequestInfo(["a", "b", "c", "d"], [None] * 4, "s", "chat", 10, 16, 16), 0.0)
    assert pol.count("a") == 0 and pol.count("d") == 1
    managed = EvictionManager(pol)
    managed.on_insert(BlockInfo("d", 10), "hbm", 0.0)
    assert list(inner.victims("hbm", set(), 1.0)) == ["d"], "the store reached the inner policy"
    assert managed.evict("hbm", 10, set(), 1.0) == ["d"]
    with pytest.raises(ValueError, match="threshold"):
        AdmissionFilter(inner, threshold=0)
