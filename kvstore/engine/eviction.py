"""The eviction manager: the rules every policy's victims obey, enforced once.

A policy only orders a tier's blocks (``victims``, worst first: see
:mod:`kvstore.policies.base`). :class:`EvictionManager` wraps it and is what the
engine calls: it keeps the policy told of every store, hit and removal, and
keeps one :class:`~kvstore.policies.children.ChildIndex` per tier beside it, so
when the engine needs room it reads the policy's order lazily, until enough is
freed, and

* never takes a protected key (pinned, in flight, the request's own blocks, the
  retention shield), nor an ancestor of one (it would strand it);
* never takes a block before its cached children in the same tier (a prefix
  stops at its first miss), whatever order the policy gave;
* passes over keys the tier does not hold, and is atomic: enough victims, or none.

vLLM learned this from fixing one eviction bug twice, once per policy: the
invariant lives in one manager, each policy is a small strategy. Placement
(admission plans, demotion targets, hints, retention deadlines) passes through
to the policy unchanged.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable, Sequence
from operator import itemgetter

from kvstore.policies import BlockInfo, Hint, Move, Plan, Policy, RequestInfo, TierSpec
from kvstore.policies.children import ChildIndex

__all__ = ["EvictionManager"]

#: a BlockInfo's (key, parent, size), as ChildIndex.add_many takes them
_KEY_PARENT_SIZE = itemgetter(0, 2, 1)


class EvictionManager:
    """The engine's face of a policy: its calls, with the eviction rules applied."""

    __slots__ = ("_children", "_later", "inner", "name", "tiers")

    def __init__(self, policy: Policy) -> None:
        self.inner = policy
        self.name: str = policy.name
        self.tiers: tuple[TierSpec, ...] = policy.tiers
        self._children = {t.name: ChildIndex() for t in policy.tiers}
        #: hits told with :meth:`on_access_many_later`, not yet passed on (oldest first)
        self._later: list[tuple[Sequence[Hashable], Sequence[str], float]] = []

    @classmethod
    def of(cls, policy: Policy | EvictionManager) -> EvictionManager:
        """``policy`` managed (a manager already is)."""
        return policy if isinstance(policy, EvictionManager) else cls(policy)

    def _index(self, tier: str) -> ChildIndex:
        try:
            return self._children[tier]
        except KeyError:
            raise ValueError(f"tier {tier!r} is not one of the policy's tiers "
                             f"{sorted(self._children)}") from None

    # -- hits told later -----------------------------------------------------------
    def on_access_many_later(self, keys: Sequence[Hashable], tiers: Sequence[str],
                             now: float) -> None:
        """:meth:`on_access_many`, passed to the policy at :meth:`settle` or before any
        other call reaches it, whichever is first: the policy sees the calls it would
        have seen, in the same order, with the same ``now``. A lookup's answer does not
        wait for its hits' recency bookkeeping (the server settles two loop turns after the
        reply); a hit whose block left its tier meanwhile is one the policy passes over,
        as it does for any access to a key it no longer holds."""
        self._later.append((keys, tiers, now))

    def settle(self) -> None:
        """Pass on the hits told later (see :meth:`on_access_many_later`), then let the
        policy do what it left for later (``Policy.settle``)."""
        later = self._later
        while later:
            keys, tiers, now = later.pop(0)
            self.inner.on_access_many(keys, tiers, now)
        self.inner.settle()

    # -- the eviction order --------------------------------------------------------
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        if self._later:
            self.settle()
        self._index(tier).add(info.key, info.parent, info.size)
        self.inner.on_insert(info, tier, now)

    def on_insert_many(self, infos: Sequence[BlockInfo], tier: str, now: float) -> None:
        if self._later:
            self.settle()
        if type(self).on_insert is not EvictionManager.on_insert:  # a subclass's own
            for info in infos:
                self.on_insert(info, tier, now)
            return
        self._index(tier).add_many(map(_KEY_PARENT_SIZE, infos))
        self.inner.on_insert_many(infos, tier, now)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        if self._later:
            self.settle()
        self.inner.on_access(key, tier, now)

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        if self._later:
            self.settle()
        self.inner.on_access_many(keys, tiers, now)

    def on_remove(self, key: Hashable, tier: str) -> None:
        if self._later:
            self.settle()
        self._index(tier).remove(key)
        self.inner.on_remove(key, tier)

    def evict(self, tier: str, nbytes: int, protected: Container[Hashable], now: float
              ) -> list[Hashable] | None:
        """Victims in ``tier`` freeing at least ``nbytes``, children before parents,
        none of them ``protected``; ``None`` when that is impossible. Nothing is
        removed here: the engine calls :meth:`on_remove` for each block it evicts."""
        if self._later:
            self.settle()
        order: Iterable[Hashable] = self.inner.victims(tier, protected, now)
        victims: list[Hashable] | None = self._index(tier).take(order, nbytes, protected)
        return victims

    # -- placement: the policy's own ---------------------------------------------------
    def on_request(self, req: RequestInfo, now: float) -> Plan:
        if self._later:
            self.settle()
        plan: Plan = self.inner.on_request(req, now)
        return plan

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        if self._later:
            self.settle()
        dst: str | None = self.inner.demote_to(key, tier, now)
        return dst

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        if self._later:
            self.settle()
        moves: list[Move] = self.inner.on_hint(hint, keys, now)
        return moves

    def on_retain(self, keys: Sequence[Hashable], until: float, now: float) -> None:
        if self._later:
            self.settle()
        self.inner.on_retain(keys, until, now)

    def on_stored(self, keys: Sequence[Hashable], now: float) -> None:
        if self._later:
            self.settle()
        self.inner.on_stored(keys, now)
