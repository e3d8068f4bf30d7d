"""Per-block reuse counts: admit and keep the prefixes that are used most.

Traffic without sessions (no ``session_id``, no hints: a proxy that forwards bare
prompts, a trace such as Mooncake's conversation trace) gives a policy nothing to
value but the blocks themselves. What it can learn is how often each prefix block
is looked up: a multi-turn conversation resends its prefix every turn, so a block
seen three times is far likelier to come back than one seen once, while the
return gaps are minutes, longer than a small tier keeps anything under LRU.

* Every lookup counts each of its keys once
  (:class:`~kvstore.policies.counts.ReuseCounts`). Counts age, as TinyLFU's do:
  after ``reset`` capacities of looked-up blocks (counted in bytes, so namespaces
  of several block sizes age them alike) every count is halved, so what was
  popular an hour ago yields to what is popular now. A halving touches no key (the
  unit a count adds doubles) and each tier's filings are halved bucket by bucket,
  so it costs the lookup that makes it milliseconds, not a pass over every key. The
  keys whose count fell to 0 are forgotten every 32 halvings, and a hard cap,
  ``max_tracked``, forgets the least recently counted first.
* Eviction takes the lowest count first, least recently used within a count
  (the engine takes children before parents, so a chain still shrinks from its
  tail).
* Admission compares, block by block from the request's first missing block: a
  block enters a tier if it has room, or if its count is higher than the count of
  the block it would push out; otherwise it bypasses the tier, and so does the
  rest of the request (a block whose parent is not stored can never be served).
  A request's last block, when partial, is never stored.

Pure: no clock, no I/O. :class:`~kvstore.policies.adaptive.AdaptivePolicy` uses
this as its bets on sessionless traffic, guarded by its LRU ghost.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterator, Sequence
from typing import Any, Self

from kvstore.policies.base import (
    BlockInfo,
    Plan,
    Policy,
    PolicyConfig,
    RequestInfo,
    TierSpec,
)
from kvstore.policies.cost import CostModel
from kvstore.policies.counts import Counted, CountTier, ReuseCounts, zero_count

__all__ = ["FrequencyPolicy"]


class FrequencyPolicy(Policy):
    name = "frequency"

    def __init__(self, tiers: Sequence[TierSpec], cost: CostModel | None = None,
                 reset: float = 20.0, max_tracked: int = 1 << 21) -> None:
        super().__init__(tiers)
        if reset <= 0:
            raise ValueError(f"reset must be > 0 (capacities of looked-up blocks), got {reset}")
        self.cost = cost or CostModel()
        self.reset = reset
        self.max_tracked = max_tracked
        self._worth = tuple(self.cost.worth_loading(t) for t in tiers)
        self._t = {t.name: CountTier(t.capacity_bytes) for t in tiers}
        self.counts: ReuseCounts | None = None  # made at the first lookup with sizes
        #: the count pass of the last :meth:`on_request` (for :meth:`on_counted`)
        self.counted = Counted(None, None, None)
        #: the counts' halvings the tiers are filed for
        self._halvings = 0
        #: requests' hits not refiled yet, with their new counts, oldest first (see
        #: :meth:`settle`)
        self._unfiled: list[tuple[Sequence[Hashable], list[int],
                                  dict[Hashable, None] | None]] = []

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        if config.cost is not None:
            options["cost"] = config.cost
        return cls(config.tiers, **options)

    def count(self, key: Hashable) -> int:
        return self.counts[key] if self.counts is not None else 0

    def _counts(self) -> ReuseCounts:
        """The counts, made at the first lookup whose blocks have a size: their period is
        ``reset`` capacities in bytes (each counted key weighs its block's bytes)."""
        if self.counts is None:
            cap = sum(t.capacity_bytes for i, t in enumerate(self.tiers) if self._worth[i])
            self.counts = ReuseCounts(max(1, round(self.reset * cap)), self.max_tracked)
        return self.counts

    # -- requests -----------------------------------------------------------------------
    def on_request(self, req: RequestInfo, now: float) -> Plan:
        if self._unfiled:
            self.settle()
        if req.worth:
            self._worth = tuple(req.worth)
        keys = req.keys
        counts = self._counts() if req.block_bytes else None
        # Distinct keys (a chain's, always) are counted in C-level passes, and their
        # new counts and the dict of them serve every tier's refiling below.
        distinct = dict.fromkeys(keys) if counts is not None and len(keys) > 1 else None
        news: list[int] | None = None
        if counts is not None and distinct is not None and len(distinct) == len(keys):
            news = counts.add_distinct(keys, req.block_bytes)
        else:
            distinct = None
            if counts is not None:
                counts.add(keys, req.block_bytes)
        self.counted = Counted(counts, distinct if news is not None else None, news)
        return self._plan(req, self.counted)

    def on_counted(self, req: RequestInfo, counted: Counted) -> Plan:
        """:meth:`on_request` of a lookup that another policy's :meth:`on_request`
        counted just before (``counted``, its :attr:`counted`): this one reads those
        counts and adds none (one count pass per lookup for both)."""
        if self._unfiled:
            self.settle()
        if req.worth:
            self._worth = tuple(req.worth)
        self.counts = counted.counts
        return self._plan(req, counted)

    def _plan(self, req: RequestInfo, counted: Counted) -> Plan:
        keys = req.keys
        counts, distinct, news = counted
        halved = counts is not None and counts.halvings != self._halvings
        if halved and counts is not None:
            # every count halved (more than once, for a ghost that missed lookups): so
            # is every filing
            times, self._halvings = counts.halvings - self._halvings, counts.halvings
            for tr in self._t.values():
                tr.halve(times)
        elif counts is not None:
            all_hit = None not in req.hit_tiers and len(keys) == len(req.hit_tiers)
            hit = (keys if all_hit else
                   [k for k, t in zip(keys, req.hit_tiers, strict=True) if t is not None])
            if hit:
                # Each tier refiles the hits it holds, in order, under their counts of
                # now, at :meth:`settle` or before any other call reads the tiers: no
                # decision below reads where the request's own keys are filed (the
                # victims pass over them), so its plan is the one it would be.
                if not all_hit or news is None:
                    distinct = None
                    news = counts.many(hit)
                self._unfiled.append((hit, news, distinct))
        hit_tiers = req.hit_tiers
        if None not in hit_tiers:  # (all hits: nothing to admit)
            return Plan({})
        missing = [j for j, t in enumerate(hit_tiers) if t is None]
        if missing and missing[-1] == len(keys) - 1 and 0 < req.last_tokens < req.block_tokens:
            missing.pop()  # a partial last block: the next turn rewrites it
        if not missing:
            return Plan({})
        tiers = [t.name for i, t in enumerate(self.tiers) if self._worth[i]]
        if not tiers:
            return Plan({})
        if counts is None:  # sizes unknown yet: nothing stored, room everywhere
            return Plan({keys[j]: tiers[0] for j in missing})
        size = max(req.block_bytes, 1)
        own = set(keys)
        # per tier: free bytes and the victims it would give up, in order
        free = {t: self._t[t].capacity - self._t[t].used for t in tiers}
        order = {t: (k for k in self._t[t].order() if k not in own) for t in tiers}
        admit: dict[Hashable, str] = {}
        for j in missing:
            c = counts[keys[j]]
            dst = None
            for t in tiers:
                if free[t] >= size:
                    free[t] -= size
                    dst = t
                    break
                v = next(order[t], None)
                if v is not None and c > self._t[t].at[v]:
                    free[t] += self._t[t].sizes[v] - size
                    dst = t
                    break
            if dst is None:
                break  # refused everywhere: its children could never be served
            admit[keys[j]] = dst
        return Plan(admit)

    def settle(self) -> None:
        """Refile the hits the requests left (see :meth:`_plan`), oldest first, in each
        tier that holds them: the same filings, in the same order, as at the request."""
        unfiled = self._unfiled
        while unfiled:
            hit, news, distinct = unfiled.pop(0)
            for tr in self._t.values():
                tr.file_many(hit, zero_count, distinct, news)  # (the counts given: news)

    # -- bookkeeping and eviction -----------------------------------------------------------
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        if self._unfiled:
            self.settle()
        tr = self._t[tier]
        if info.key in tr.at:
            return
        tr.sizes[info.key] = info.size
        tr.used += info.size
        tr.file(info.key, self.count(info.key))

    def on_insert_many(self, infos: Sequence[BlockInfo], tier: str, now: float) -> None:
        if self._unfiled:
            self.settle()
        if type(self).on_insert is not FrequencyPolicy.on_insert:  # a subclass's own
            super().on_insert_many(infos, tier, now)
            return
        tr = self._t[tier]
        at, sizes, file = tr.at, tr.sizes, tr.file
        counts = (self.counts.many([info.key for info in infos]) if self.counts is not None
                  else [0] * len(infos))
        for info, c in zip(infos, counts, strict=True):
            key = info.key
            if key in at:
                continue
            sizes[key] = info.size
            tr.used += info.size
            file(key, c)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        if self._unfiled:
            self.settle()
        tr = self._t[tier]
        if key in tr.at:
            tr.file(key, self.count(key))

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        if self._unfiled:
            self.settle()
        if len(keys) != len(tiers):
            raise ValueError(f"{len(keys)} keys but {len(tiers)} tiers")
        if not keys:
            return
        counts = self.counts.many(keys) if self.counts is not None else [0] * len(keys)
        tier = tiers[0]
        if tiers.count(tier) == len(tiers):  # (one tier: one pass)
            self._t[tier].file_many(keys, zero_count, None, counts)
            return
        trs = self._t
        for key, tier, c in zip(keys, tiers, counts, strict=True):
            trs[tier].file_many((key,), zero_count, None, (c,))

    def on_remove(self, key: Hashable, tier: str) -> None:
        if self._unfiled:
            self.settle()
        self._t[tier].drop(key)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterator[Hashable]:
        if self._unfiled:
            self.settle()
        return self._t[tier].order()
