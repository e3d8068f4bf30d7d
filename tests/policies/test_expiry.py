"""The workload policy's per-tier expiry ledger: expiry order, prefix rule, pending parents."""

from __future__ import annotations

from kvstore.policies._expiry import ExpiryLedger


def _add(led: ExpiryLedger, key: str, parent: str | None, expiry: float, size: int = 1) -> None:
    led.add(key, parent, ("cls", 0.0, size), expiry)


def test_victims_go_in_expiry_order_and_untaken_candidates_stay_queued() -> None:
    led = ExpiryLedger(capacity=10)
    _add(led, "a", None, 30.0)
    _add(led, "b", None, 10.0)
    _add(led, "c", None, 20.0)
    assert led.used == 3 and led.earliest() == 10.0
    assert led.take(1, protected=set()) == ["b"]
    led.remove("b")
    assert led.take(1, protected={"c"}) == ["a"]  # c is protected, a is next
    assert led.earliest() == 20.0  # c was popped as a candidate and pushed back
    assert led.take(5, protected=set()) is None  # not enough bytes in the tier


def test_a_cached_parent_lives_as_long_as_its_longest_lived_child() -> None:
    led = ExpiryLedger(capacity=10)
    _add(led, "p", None, 10.0)
    _add(led, "c", "p", 50.0)
    assert led.expiry("p", 0.0) == 50.0
    led.set_expiry("c", 60.0)
    assert led.expiry("p", 0.0) == 60.0
    led.set_expiry("p", 5.0)  # re-setting the parent alone may shorten it
    assert led.take(1, protected=set()) == ["c"]  # still children first


def test_a_child_stored_first_leaves_its_expiry_pending_for_the_parent() -> None:
    led = ExpiryLedger(capacity=10)
    _add(led, "c", "p", 40.0)  # tail first, as vLLM frees
    _add(led, "p", None, 10.0)
    assert led.expiry("p", 0.0) == 40.0
    assert led.remove("c") and not led.remove("c")
    assert "c" not in led and "p" in led and led.used == 1
