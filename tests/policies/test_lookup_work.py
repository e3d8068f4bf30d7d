"""A lookup's work in the default policy's reuse counts, counted rather than timed
(issue 25): where the hit blocks are held in two tiers (``kvstore serve``'s DRAM and
disk, after the write-back) each tier refiles them in one pass, not one Python call
per block and tier; the filing is the per-key loop's."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from kvstore.policies.base import BlockInfo, RequestInfo, TierSpec
from kvstore.policies.counts import CountTier
from kvstore.policies.frequency import FrequencyPolicy

TIERS = [TierSpec("dram", 1 << 20, 20e9), TierSpec("disk", 1 << 24, 3e9)]


def _stored(n: int, both: int) -> tuple[FrequencyPolicy, list[Hashable]]:
    """n keys in DRAM, the first ``both`` of them on disk too."""
    p = FrequencyPolicy(TIERS)
    keys: list[Hashable] = [("ns", j) for j in range(n)]
    for j, k in enumerate(keys):
        p.on_insert(BlockInfo(k, 64), "dram", 0.0)
        if j < both:
            p.on_insert(BlockInfo(k, 64), "disk", 0.0)
    return p, keys


def _lookup(p: FrequencyPolicy, keys: list[Hashable], extra: int = 0) -> None:
    missing = [("new", j) for j in range(extra)]
    p.on_request(RequestInfo([*keys, *missing], ["dram"] * len(keys) + [None] * extra, "",
                             "chat", 64, 16, 16), 0.0)
    p.settle()  # (what it left for later: the engine settles once the answer is out)


def test_a_lookup_held_in_two_tiers_refiles_each_tier_in_one_pass(monkeypatch: Any) -> None:
    p, keys = _stored(500, 300)
    _lookup(p, keys)  # the counts sized at the first lookup
    calls = {"file": 0, "file_many": 0}
    file, file_many = CountTier.file, CountTier.file_many

    def counted_file(self: Any, *a: Any) -> None:
        calls["file"] += 1
        file(self, *a)

    def counted_many(self: Any, *a: Any) -> None:
        calls["file_many"] += 1
        file_many(self, *a)

    monkeypatch.setattr(CountTier, "file", counted_file)
    monkeypatch.setattr(CountTier, "file_many", counted_many)
    for _ in range(3):
        _lookup(p, keys, extra=2)
    assert calls == {"file": 0, "file_many": 2 * 3}  # (it was 800 file calls a lookup)


def test_the_two_tier_refile_is_the_per_key_loops() -> None:
    fast, keys = _stored(40, 25)
    ref, _ = _stored(40, 25)
    for step in range(6):
        picked = keys[step:] if step % 2 else keys[:30 - step]
        _lookup(fast, picked, extra=step % 3)
        # the per-key loop: count, then each hit key refiled in each tier holding it
        counts = ref._counts()
        counts.add([*picked, *[("new", j) for j in range(step % 3)]], 64)  # (64-byte blocks)
        for k in picked:
            for tr in ref._t.values():
                if k in tr.at:
                    tr.file(k, counts[k])
        for name in ("dram", "disk"):
            a, b = fast._t[name], ref._t[name]
            assert list(a.at.items()) == list(b.at.items()), (step, name)
            assert list(a.order()) == list(b.order()), (step, name)


def _python_calls(fn: Any) -> int:
    """Python-level function calls made while ``fn()`` runs (C calls not counted)."""
    import sys

    calls = [0]

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls[0]


def test_a_shared_prefix_looked_up_by_another_session_costs_no_call_per_block() -> None:
    """A prefix every session shares (a system prompt, or blocks put without a session
    and looked up by a named one): its keys are the workload's pool's, and a lookup of
    them walks them in C-level passes, as a session's own prefix does, not one Python
    call per block (it was 1,000 calls for 1,000 blocks: a dataclass hash each)."""
    from kvstore.policies.workload import WorkloadPolicy

    def calls_for(n: int) -> int:
        p = WorkloadPolicy(TIERS)
        keys: list[Hashable] = [("sys", j) for j in range(n)]
        for k in keys:
            p.on_insert(BlockInfo(k, 64, None, "a", "chat", 16, n), "dram", 0.0)
        for step, s in enumerate(("a", "b", "c")):  # b's lookup makes them the pool's
            req = RequestInfo(keys, ["dram"] * n, s, "chat", 64, 16, 16, session_named=True)
            p.on_request(req, float(step))
        req = RequestInfo(keys, ["dram"] * n, "d", "chat", 64, 16, 16, session_named=True)
        return _python_calls(lambda: p.on_request(req, 5.0))

    assert calls_for(500) == calls_for(50)


def _python_lines(fn: Any) -> int:
    """Lines of Python run while ``fn()`` runs: a Python loop over a lookup's blocks
    runs lines per block, a C-level pass (map, dict.update, deque) none."""
    import sys

    lines = [0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            lines[0] += 1
        return local

    def trace(frame: Any, event: str, arg: Any) -> Any:
        return local

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(old)
    return lines[0]


def test_a_first_lookup_of_a_stored_chain_runs_no_python_line_per_block() -> None:
    """The served path's policy calls for the first lookup of a chain earlier requests
    stored (a new request; its session's own prefix, a prefix other sessions shared,
    one that names no session): the default policy's experts (the workload bets, the
    reuse counts, LRU) and its ghosts count, refile, claim and touch the blocks in
    C-level passes. Pinned as lines of Python run: the same for 500 blocks as for 50
    (it was thousands per lookup: a loop per block in the reuse counts' add and in
    the shared prefix's return gaps)."""
    from kvstore.policies.adaptive import AdaptivePolicy

    def lines_for(n: int, session: str, named: bool) -> int:
        p = AdaptivePolicy(TIERS)
        keys: list[Hashable] = [("chain", j) for j in range(n)]
        for k in keys:  # stored by a first request, written back to disk
            for t in ("dram", "disk"):
                p.on_insert(BlockInfo(k, 64, None, "a", "chat", 16, n), t, 0.0)
        for step, s in enumerate(("a", "b", "~0", "a")):  # looked up before: sessions
            req = RequestInfo(keys, ["dram"] * n, s, "chat", 64, 16, 16,  # a, b, unnamed
                              session_named=not s.startswith("~"))
            p.on_request(req, float(step))
            p.on_access_many(keys[::-1], ["dram"] * n, float(step))
        req = RequestInfo(keys, ["dram"] * n, session, "chat", 64, 16, 16,
                          session_named=named)

        def lookup() -> None:
            p.on_request(req, 5.0)
            p.on_access_many(keys[::-1], ["dram"] * n, 5.0)

        return _python_lines(lookup)

    for session, named in (("a", True), ("c", True), ("~0", False), ("~1", False)):
        assert lines_for(500, session, named) == lines_for(50, session, named), session
