"""``ChildIndex.take``: children before parents, protected blocks and their ancestors
kept, and a walk that stops as soon as enough is freed."""

from __future__ import annotations

from collections.abc import Hashable

from kvstore.policies._prefix import ChildIndex


class CountingSet:
    """A protected set that counts how often it is asked."""

    def __init__(self, keys: set[Hashable]) -> None:
        self.keys = keys
        self.asked = 0

    def __contains__(self, key: object) -> bool:
        self.asked += 1
        return key in self.keys


def test_a_protected_leaf_keeps_its_ancestors_not_its_cousins() -> None:
    #        r
    #      /   \
    #     a     b
    #    / \     \
    #   a1  a2    b1 (protected)
    idx = ChildIndex()
    for key, parent in [("r", None), ("a", "r"), ("b", "r"), ("a1", "a"), ("a2", "a"),
                        ("b1", "b")]:
        idx.add(key, parent, 1)
    victims = idx.take([("r", 1)], 3, {"b1"})
    assert victims is not None and set(victims) == {"a", "a1", "a2"}
    assert victims.index("a") > max(victims.index("a1"), victims.index("a2"))
    assert idx.take([("r", 1)], 4, {"b1"}) is None  # r and b must stay with b1


def test_a_shared_prefix_with_many_descendants_is_not_walked_whole() -> None:
    # One system prompt block under which 20,000 conversations of 3 blocks are cached.
    idx = ChildIndex()
    idx.add("root", None, 1)
    for c in range(20_000):
        idx.add((c, 0), "root", 1)
        idx.add((c, 1), (c, 0), 1)
        idx.add((c, 2), (c, 1), 1)
    protected = CountingSet({(7, 2)})
    victims = idx.take([("root", 1)], 2, protected)
    assert victims is not None and len(victims) == 2
    assert "root" not in victims
    first, second = victims
    assert first[1] == 2 and second[1] == 1 and first[0] == second[0]  # a tail, leaf first
    assert protected.asked < 20  # the old walk asked about all 60,001 blocks


def test_a_root_not_in_the_index_gives_nothing() -> None:
    idx = ChildIndex()
    idx.add("child", "ghost", 1)
    assert idx.take([("ghost", 1)], 1, set()) is None


def test_a_chain_ending_in_a_protected_block_is_walked_once_per_call() -> None:
    idx = ChildIndex()
    n = 2000
    for i in range(n):
        idx.add(i, i - 1 if i else None, 1)
    protected = CountingSet({n - 1})  # the tail is pinned: nothing of the chain may go
    assert idx.take([(i, 1) for i in range(n)], 1, protected) is None
    assert protected.asked < 3 * n  # not once per block per walk (~n * n / 2)
