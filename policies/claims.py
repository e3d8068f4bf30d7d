"""A workload policy's claims: which session, or which workload's pool, owns a block.

Part of :class:`~kvstore.policies.workload.WorkloadPolicy` (its ownership half). A
block belongs to the session that used it last; a block several sessions used (a
system prompt, a RAG document, a tool schema) goes to its workload's *pool*
(:class:`~kvstore.policies._owners.Pool`), valued by how soon shared blocks come back:
a shared key's reuse gaps are learned as the workload's "shared" wait. Each key's last
use is kept in two generations of at most ``max_sessions * 10`` keys.

A lookup claims its blocks in each tier that holds them
(:class:`~kvstore.policies._owners.TierOwners`). The common cases (the session's own
prefix back, or a prefix of its workload's pool) are claimed in C-level passes here;
:meth:`WorkloadPolicy.on_request <kvstore.policies.workload.WorkloadPolicy.on_request>`
walks the keys one by one otherwise, with the same uses, claims and positions.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import repeat
from operator import itemgetter, sub
from typing import TYPE_CHECKING, Any

from kvstore.policies._owners import Pool

if TYPE_CHECKING:
    from kvstore.policies._owners import TierOwners
    from kvstore.policies.returns import ReturnTimes

__all__ = ["Claims"]

_FIRST, _SECOND = itemgetter(0), itemgetter(1)


class Claims:
    """Block uses, pools and claims, a part of
    :class:`~kvstore.policies.workload.WorkloadPolicy`."""

    if TYPE_CHECKING:
        # What this part reads of the policy (set in WorkloadPolicy.__init__).
        max_sessions: int
        returns: ReturnTimes
        _t: dict[str, TierOwners]
        _uses: dict[Hashable, tuple[Hashable | None, float]]
        _old_uses: dict[Hashable, tuple[Hashable | None, float]]
        _pools: dict[str, Pool]

        def _score(self, cls: Hashable, e: float) -> float: ...

    # -- pools and uses -----------------------------------------------------------------
    def _pool_value(self, pool: Pool, now: float) -> float:
        """A pool is worth what its least recently used block is: shared blocks of the
        workload, idle that long, come back within the window that often."""
        for tr in self._t.values():
            key = tr.oldest(pool)
            if key is not None:
                use = self._uses.get(key) or self._old_uses.get(key)
                age = now - use[1] if use is not None else 1e9
                return self._score((pool.workload, "shared", "", 0, 0), age)
        return 0.0

    def _pool(self, workload: str) -> Pool:
        """The one :class:`Pool` object of ``workload`` (owners compare by identity
        first, a block's claim being the hot path of every lookup)."""
        pool = self._pools.get(workload)
        if pool is None:
            pool = self._pools[workload] = Pool(workload)
        return pool

    # -- the lookup's claims, in C-level passes ------------------------------------------
    def _claim_run(self, keys: Sequence[Hashable], hit: Sequence[str | None],
                   name: Hashable, mine: tuple[Hashable, float],
                   prevs: list[tuple[Hashable, float] | None]) -> bool:
        """:meth:`on_request`'s walk over the keys in C-level passes, for the common
        case only (False: nothing done): the session's prefix back (each key last used
        by this session, none shared), then keys never seen, the hits a prefix of
        them in one tier. The same uses, claims and positions as the walk. ``prevs``:
        each key's use (``self._uses.get``)."""
        n = len(keys)
        if not n or len(hit) != n:
            return False
        uses = self._uses
        fresh = prevs.count(None)
        m = n - fresh  # keys known, a prefix
        if m:
            p0 = prevs[0]
            if p0 is None or p0[0] != name or prevs.count(p0) != m:
                return False
        if len(uses) + fresh > self.max_sessions * 10:
            return False  # (the walk would turn a generation over)
        if fresh:
            if prevs.index(None) != m:
                return False
            if list(map(self._old_uses.get, keys[m:])).count(None) != fresh:
                return False
        nh = n - hit.count(None)  # hits, a prefix in one tier
        if nh and (hit[0] is None or hit.count(hit[0]) != nh
                   or (nh < n and hit.index(None) != nh)):
            return False
        uses.update(zip(keys, repeat(mine)))
        if nh:
            t0 = hit[0]
            assert t0 is not None
            self._t[t0].claim_run(keys[:nh] if nh < n else keys, name)
        return True

    def _pooled_run(self, keys: Sequence[Hashable], hit: Sequence[str | None],
                    name: Hashable, pool: Pool, pooled: tuple[None, float],
                    prevs: list[Any]) -> list[float] | None:
        """:meth:`on_request`'s walk in C-level passes for its other common case (None:
        nothing done): every key distinct and last used by the workload's pool (a
        prefix shared between sessions, as a system prompt is), the hits a prefix of
        them in one tier. The same uses and claims as the walk; returns the keys'
        reuse gaps (each key a shared start). ``prevs``: each key's use."""
        n = len(keys)
        if not n or len(hit) != n or name is None:
            return None
        uses = self._uses
        if None in prevs or list(map(_FIRST, prevs)).count(None) != n:
            return None
        if len(uses) > self.max_sessions * 10:
            return None
        # key -> chain position (and: are they distinct?)
        at = dict(zip(keys, range(n), strict=True))
        if len(at) != n:
            return None
        nh = n - hit.count(None)  # hits, a prefix in one tier
        if nh and (hit[0] is None or hit.count(hit[0]) != nh
                   or (nh < n and hit.index(None) != nh)):
            return None
        uses.update(dict.fromkeys(at, pooled))  # (the hashes known: no second hashing)
        if nh:
            t0 = hit[0]
            assert t0 is not None
            self._t[t0].claim_run(keys[:nh] if nh < n else keys, pool,
                                  at if nh == n else None)
        return list(map(sub, repeat(pooled[1]), map(_SECOND, prevs)))
