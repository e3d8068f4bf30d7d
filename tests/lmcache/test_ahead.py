"""``HeldAhead``: slots a contains held for the get that follows it (no LMCache needed)."""

from __future__ import annotations

import time
from collections.abc import Callable

from kvstore.connectors.lmcache.ahead import HeldAhead

from kvstore.client import HeldRead


def _held(n: int, ended: list[int], tag: int = 0, expires_in: float = 30.0) -> HeldRead:
    views: list[memoryview | None] = [memoryview(bytes([tag, i])) for i in range(n)]
    return HeldRead(views, [2] * n, [], time.monotonic() + expires_in,
                    lambda: ended.append(tag))


def _wait(cond: Callable[[], bool], within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not cond():
        time.sleep(0.01)
    return cond()


def test_a_get_takes_what_the_contains_held_and_the_lease_ends_with_it() -> None:
    ended: list[int] = []
    ahead = HeldAhead(ttl_s=30)
    held = _held(3, ended)
    ahead.keep("ns", [b"a", b"b", b"c"], held)
    got = ahead.take("ns", [b"b", b"x", b"a"])
    assert got[1] is None and got[0] == (held, 1) and got[2] == (held, 0)
    assert ahead.take("ns", [b"b"]) == [None]  # taken once
    assert ahead.take("other", [b"c"]) == [None]  # namespaces never mix
    # take_all: all or nothing.
    assert ahead.take_all([("ns", b"c"), ("ns", b"zz")]) is None and len(ahead) == 1
    assert ahead.take_all([("ns", b"c")]) == [(held, 2)] and len(ahead) == 0
    for j in (0, 1, 2):
        held.let_go(j)
    assert ended == [0] and ahead.counts == {"taken": 3, "unused": 0}


def test_what_no_get_takes_is_let_go_after_the_ttl() -> None:
    ended: list[int] = []
    ahead = HeldAhead(ttl_s=0.1)
    ahead.keep("ns", [b"a", b"b"], _held(2, ended, tag=1))
    assert ended == [] and len(ahead) == 2
    assert _wait(lambda: ended == [1])
    assert len(ahead) == 0 and ahead.counts == {"taken": 0, "unused": 2}


def test_holding_a_chunk_again_lets_go_of_the_older_slot() -> None:
    ended: list[int] = []
    ahead = HeldAhead(ttl_s=30)
    first, second = _held(2, ended, tag=1), _held(1, ended, tag=2)
    ahead.keep("ns", [b"a", b"b"], first)
    ahead.keep("ns", [b"b"], second)  # b again: first's slot for b goes back
    assert ahead.counts["unused"] == 1 and first.held == 1
    assert ahead.take("ns", [b"b"]) == [(second, 0)]
    ahead.close()  # a goes back: first's lease ends; second's is the taker's
    assert ended == [1] and ahead.counts == {"taken": 1, "unused": 2}
    third = _held(1, ended, tag=3)
    ahead.keep("ns", [b"c"], third)  # after close: let go at once
    assert ended == [1, 3] and len(ahead) == 0


def test_views_that_are_not_held_are_not_kept() -> None:
    ended: list[int] = []
    held = HeldRead([memoryview(b"x"), None], [1, 0], [1], time.monotonic() + 30,
                    lambda: ended.append(0))
    ahead = HeldAhead(ttl_s=30)
    ahead.keep("ns", [b"a", b"b"], held)
    assert len(ahead) == 1 and ahead.take("ns", [b"b"]) == [None]
    ahead.close()
    assert ended == [0]
