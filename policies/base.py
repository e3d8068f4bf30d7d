"""The policy interface: pure keep / offload / drop decisions over block keys.

A policy sees block keys, sizes and the facts the engine passes in (session,
workload, hints, tier capacities, time as an argument). It owns no bytes, does
no I/O, reads no clock and has no globals, so the same object runs inside the
server and in the replay simulator at millions of events per second.

The engine calls, per tier (tiers are ordered fastest first):

* ``admit(info, now)`` -> name of the tier a new block enters, or ``None`` (drop).
* ``on_insert(info, tier, now)`` once the block is stored there.
* ``on_access(key, tier, now)`` on every hit.
* ``on_remove(key, tier)`` when the block left that tier for any reason.
* ``evict(tier, nbytes, protected, now)`` -> victims freeing at least ``nbytes``,
  or ``None`` if that is impossible without touching ``protected`` keys
  (pinned / in flight). Atomic: either enough victims or none.
* ``demote_to(key, tier, now)`` -> where a victim goes (a slower tier) or ``None``.
* ``on_hint(hint, keys, now)`` -> moves to run between turns (offload, drop, promote).
* ``on_lookup(keys, hit_tiers, info, now)`` -> moves to run when a session is back
  (prefetch into a faster tier).

Keys are any hashable (``BlockKey`` in the server, ints in trace replay).

Call order the policies rely on (the replay simulator follows it):

* ``on_lookup`` with every key of a request (hits and misses) before any of its
  blocks is admitted; reuse counts and learned return times come from it.
* A request's blocks are touched / stored from the last to the first (vLLM's
  free order), so a parent is never older than its child.
* ``evict`` returns victims with every cached descendant before its ancestor
  (see ``kvstore.policies._prefix``); the engine calls ``on_remove`` for each.
* The cost model (``kvstore.policies.cost.CostModel``) decides whether a hit in
  a tier beats recompute; the engine does not load a hit that loses, and the
  workload policy never demotes into such a tier.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["BlockInfo", "Hint", "Move", "Policy", "TierSpec"]


@dataclass(frozen=True, slots=True)
class TierSpec:
    """A tier as a policy sees it."""

    name: str
    capacity_bytes: int
    #: Read bandwidth into the engine, bytes per second (for the cost model).
    read_bytes_per_s: float = 10e9


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """What a policy may know about a block when it is stored."""

    key: Hashable
    size: int
    parent: Hashable | None = None
    session_id: str = ""
    workload: str = "unknown"
    num_tokens: int = 0
    #: Length in blocks of the request that produced this block.
    request_blocks: int = 0


@dataclass(frozen=True, slots=True)
class Hint:
    """A turn or session event. ``event`` is one of :data:`Hint.EVENTS`: ``turn_end``
    (the model answered; the session waits on its user), ``tool_call`` (it waits on
    ``tool``), ``tool_result`` (the tool returned) and ``user`` (the user is back): its
    next request is imminent, ``session_start``, ``session_end`` (its private blocks
    may go). ``expected_gap_s``: how long until the session's next request, if known."""

    EVENTS: ClassVar[tuple[str, ...]] = (
        "turn_end",
        "tool_call",
        "tool_result",
        "user",
        "session_start",
        "session_end",
    )

    session_id: str
    event: str
    workload: str = "unknown"
    tool: str | None = None
    expected_gap_s: float | None = None


@dataclass(frozen=True, slots=True)
class Move:
    """Move ``key`` from tier ``src`` to tier ``dst``; ``dst=None`` drops it from ``src``."""

    key: Hashable
    src: str
    dst: str | None


class Policy(ABC):
    """Base class: subclasses implement the eviction order; placement has defaults."""

    name: ClassVar[str] = "base"

    def __init__(self, tiers: Sequence[TierSpec]) -> None:
        if not tiers:
            raise ValueError("a policy needs at least one tier")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        self.tiers: tuple[TierSpec, ...] = tuple(tiers)
        self._order = {t.name: i for i, t in enumerate(self.tiers)}

    # -- placement (defaults: enter the fastest tier, demote one level) --------
    def admit(self, info: BlockInfo, now: float) -> str | None:
        return self.tiers[0].name

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        i = self._order[tier] + 1
        return self.tiers[i].name if i < len(self.tiers) else None

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        """``keys`` are the session's blocks with the fastest tier each is in."""
        return []

    def on_lookup(
        self, keys: Sequence[Hashable], hit_tiers: Sequence[str | None], info: BlockInfo,
        now: float,
    ) -> list[Move]:
        return []

    # -- per-tier bookkeeping and eviction order -------------------------------
    @abstractmethod
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None: ...

    @abstractmethod
    def on_access(self, key: Hashable, tier: str, now: float) -> None: ...

    @abstractmethod
    def on_remove(self, key: Hashable, tier: str) -> None: ...

    @abstractmethod
    def evict(
        self, tier: str, nbytes: int, protected: Container[Hashable], now: float
    ) -> list[Hashable] | None: ...
