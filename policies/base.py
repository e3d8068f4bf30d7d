"""The policy interface: pure keep / offload / drop decisions over block keys.

A policy sees block keys, sizes and the facts the engine passes in (session,
workload, hints, tier capacities, time as an argument). It owns no bytes, does
no I/O, reads no clock and has no globals, so the same object runs inside the
server and in the trace replay, which drives the same engine.

Writing a policy: subclass :class:`Policy`, set ``name``, implement the four
methods of part 1 (the eviction order); part 2 (placement) is optional. Register
it in :mod:`kvstore.policies` (``"name": "module:Class"``); the engine builds it
with :meth:`Policy.from_config`. Tiers are ordered fastest first; keys are
hashable (``BlockKey`` in the engine). LRU (:mod:`kvstore.policies.lru`) is the
whole contract in forty lines.

Part 1, required: the order in which a tier's blocks go.

* ``on_insert(info, tier, now)``: the block is now stored in ``tier``.
* ``on_access(key, tier, now)``: a hit on the block in ``tier``.
* ``on_remove(key, tier)``: the block left ``tier`` (evicted, demoted, deleted,
  dropped by a hint). The only call that takes a block out of your view.
* ``victims(tier, protected, now)``: the blocks of ``tier``, worst first, as a
  lazy iterable. The engine's eviction manager
  (:mod:`kvstore.engine.eviction`) reads it only until it has freed enough, and
  enforces the rules itself, for every policy: it skips ``protected`` keys
  (pinned, being copied, the request's own blocks, retained ones) and any key
  not stored in the tier, takes a block's cached children before it (a prefix
  is lost from its first missing block, so a chain shrinks from its tail
  whatever order you give), is atomic (enough victims, or none) and calls
  ``on_remove`` for each block it evicts. So ``victims`` must not change what
  you hold or the order you yield while it is read: a reader may stop anywhere
  or take nothing. You need not filter ``protected``; it is passed so that an
  order which ages the blocks it passes over (S3-FIFO's CLOCK hand) can leave
  those alone.

Part 2, optional, with defaults that make an LRU-like cache:

* ``on_request(req, now) -> Plan``: once per request, when the engine looks it up
  (a repeated lookup of the same request is not passed again). ``req`` has every
  key of the request, hits and misses, with the fastest tier of each hit. The
  :class:`Plan` says which tier each *missing* key may enter when its bytes are
  stored later (a key absent from ``plan.admit`` is refused), and what to move
  now (prefetch a returning session's blocks). The engine keeps the plan until
  the blocks are stored: requests may interleave. A block stored without a
  lookup first (a plain put) gets a request of its own made of the put's blocks.
  Default: admit every missing key into the fastest tier.
* ``demote_to(key, tier, now)``: where a victim of ``tier`` goes (a slower tier),
  or ``None`` to drop it. Default: the next tier.
* ``on_hint(hint, keys, now) -> moves``: a turn or session event; ``keys`` are the
  session's blocks with the fastest tier each is in. Default: nothing.
* ``on_retain(keys, until, now)``: a client retained ``keys`` until ``until`` (its
  statement of their next use). The engine protects them itself (retained blocks
  are never a policy's victims while within their tenant's retention quota, and go
  last); a policy may use the deadline to rank the rest. Default: nothing.

A decorator that changes one decision (an admission filter) subclasses
:class:`Wrapper` and overrides only that method; the rest reaches the wrapped
policy unchanged.

Call order within one request: ``on_request``, then ``on_access`` for each hit
and ``on_insert`` for each block stored, from the last block to the first
(vLLM's free order: a parent is never older than its child). Hints come between
requests. ``on_insert`` also follows every copy the engine makes (write-back,
demotion, prefetch), and ``on_remove`` every removal.

The cost model (:class:`kvstore.policies.cost.CostModel`) says whether a hit in
a tier beats recompute: the engine serves a prefix only up to the first block
whose fastest tier loses, and a policy should not place blocks there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Self

if TYPE_CHECKING:
    from kvstore.policies.cost import CostModel

__all__ = ["BlockInfo", "Hint", "Move", "Plan", "Policy", "PolicyConfig", "RequestInfo",
           "TierSpec", "Wrapper", "ghost_victims"]


@dataclass(frozen=True, slots=True)
class TierSpec:
    """A tier as a policy sees it."""

    name: str
    capacity_bytes: int
    #: Read bandwidth into the engine, bytes per second (for the cost model).
    read_bytes_per_s: float = 10e9


class BlockInfo(NamedTuple):
    """What a policy may know about a block when it is stored.

    A NamedTuple rather than a frozen dataclass (immutable and hashable either way):
    one is built per stored block, on a commit's path and in the ghosts' stores, and a
    frozen dataclass takes 1.5 us to build here against 0.3 for a tuple."""

    key: Hashable
    size: int
    parent: Hashable | None = None
    #: The block's session: any hashable the engine chooses (the engine passes a
    #: ``(namespace, session_id)`` key); ``""``: none known.
    session_id: Hashable = ""
    workload: str = "unknown"
    num_tokens: int = 0
    #: Length in blocks of the request that produced this block.
    request_blocks: int = 0


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One request as the engine looked it up."""

    keys: Sequence[Hashable]
    #: Fastest tier holding each key (``None``: not stored). The served prefix is
    #: the leading run of tiers worth loading from.
    hit_tiers: Sequence[str | None]
    #: The request's session (as in :class:`BlockInfo`).
    session_id: Hashable = ""
    workload: str = "unknown"
    #: Bytes a block of this request's namespace occupies in a tier (what capacity
    #: counts; measured by the engine). 0: not known yet (nothing of the namespace
    #: stored so far).
    block_bytes: int = 0
    #: Tokens of a full block.
    block_tokens: int = 0
    #: Tokens in the last block (< block_tokens: a partial block the next turn rewrites).
    last_tokens: int = 0
    #: Per tier, in order: does a hit there beat recomputing the block (the engine's
    #: cost model for this namespace)? Empty: every tier does.
    worth: Sequence[bool] = ()
    #: The hint event the client says this request's turn ends with (``tool_call``,
    #: ``turn_end``, ``session_end``; ``""``: not said), the tool it will wait on, and
    #: how long until the session's next request, if the client knows.
    then: str = ""
    tool: str = ""
    expected_gap_s: float | None = None
    #: False when the client named no session and the engine inferred ``session_id``
    #: from the prefix chain (traffic without sessions: a policy may value blocks
    #: rather than sessions).
    session_named: bool = True
    #: Leading blocks of ``keys`` the serving engine's own prefix cache holds (vLLM's
    #: ``num_computed_tokens`` in blocks, said by its connector); None: not known.
    engine_hit: int | None = None
    #: The keys of the lookup chain this request's blocks continue (a request's decode
    #: blocks, stored after its lookup: the engine's store keeps that chain as well as
    #: the blocks it stores); empty: none.
    continues: Sequence[Hashable] = ()
    #: The engine's id of the request (its lookup's, which its later stores of decode
    #: blocks share); None: not known.
    request_id: Hashable = None

    def info(self, j: int) -> BlockInfo:
        """The BlockInfo of key ``j`` (its parent is key ``j - 1``)."""
        keys = self.keys
        last = len(keys) - 1
        return BlockInfo(keys[j], self.block_bytes, keys[j - 1] if j else None,
                         self.session_id, self.workload,
                         self.last_tokens if j == last else self.block_tokens, len(keys))


@dataclass(frozen=True, slots=True)
class Move:
    """Move ``key`` from tier ``src`` to tier ``dst``; ``dst=None`` drops it from ``src``."""

    key: Hashable
    src: str
    dst: str | None


@dataclass(frozen=True, slots=True)
class Plan:
    """A policy's answer to a request: where its missing keys may be stored, and
    what to move now."""

    admit: Mapping[Hashable, str] = field(default_factory=dict)
    moves: Sequence[Move] = ()
    #: HBM keep: how long the serving engine should keep the request's blocks pinned in
    #: its own KV cache after the request ends, for the session's next request to reuse
    #: with no copy. 0: release them (what was stored stays in the tiers).
    keep_s: float = 0.0


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

    #: The session (as in :class:`BlockInfo`; a client's plain id until the engine
    #: scopes it by namespace).
    session_id: Hashable
    event: str
    workload: str = "unknown"
    tool: str | None = None
    expected_gap_s: float | None = None
    #: The request the hint ends (the engine's id, as in :class:`RequestInfo`; set by the
    #: engine from the request it closes), None: not known.
    request_id: Hashable = None


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """What the engine gives every policy it builds (:meth:`Policy.from_config`); a
    policy takes the fields it uses, by name, and ignores the rest."""

    tiers: Sequence[TierSpec]
    #: The engine's cost model (None: the policy's own default).
    cost: CostModel | None = None
    #: The longest HBM keep a policy may decide (None: the policy's own default).
    hbm_keep_max_s: float | None = None


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

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        """The policy for ``config``; ``options`` are its own keyword settings. The
        default takes only the tiers: a policy that uses the cost model or the HBM
        keep limit overrides this and names them."""
        return cls(config.tiers, **options)

    # -- part 1: the eviction order of each tier -------------------------------
    @abstractmethod
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None: ...

    def on_insert_many(self, infos: Sequence[BlockInfo], tier: str, now: float) -> None:
        """:meth:`on_insert` of each of ``infos`` into ``tier``, in that order (a store's
        blocks in one call: a policy whose insert is cheap overrides this to skip the
        call per block)."""
        insert = self.on_insert
        for info in infos:
            insert(info, tier, now)

    @abstractmethod
    def on_access(self, key: Hashable, tier: str, now: float) -> None: ...

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        """:meth:`on_access` of each ``(keys[i], tiers[i])``, in that order (a lookup's
        hits in one call: a policy whose touch is cheap overrides this to skip the
        call per block)."""
        access = self.on_access
        for key, tier in zip(keys, tiers, strict=True):
            access(key, tier, now)

    @abstractmethod
    def on_remove(self, key: Hashable, tier: str) -> None: ...

    @abstractmethod
    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterable[Hashable]: ...

    # -- part 2: placement (defaults: enter the fastest tier, demote one level) --
    def on_request(self, req: RequestInfo, now: float) -> Plan:
        hit = req.hit_tiers
        if None not in hit and len(hit) == len(req.keys):
            return Plan({})  # (all hits: nothing to admit)
        top = self.tiers[0].name
        return Plan({k: top for k, t in zip(req.keys, hit, strict=True) if t is None})

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        i = self._order[tier] + 1
        return self.tiers[i].name if i < len(self.tiers) else None

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        """``keys`` are the session's blocks with the fastest tier each is in."""
        return []

    def on_retain(self, keys: Sequence[Hashable], until: float, now: float) -> None:
        """A client says ``keys`` are used again before ``until``."""
        return None

    def on_stored(self, keys: Sequence[Hashable], now: float) -> None:
        """A store of ``keys`` (a request's blocks: those held already and those it
        placed) ended: the engine stores a request's blocks when its prefill ends, not
        at its lookup. A policy that models the engine's stores (the adaptive policy's
        ghosts) waits for it."""
        return None

    # -- part 3: bookkeeping no answer waits for ----------------------------------
    def settle(self) -> None:
        """Do now what the policy left for later: the engine calls it when its loop is
        free (after a lookup is answered). A policy may leave bookkeeping that no
        decision of the call it came with reads (a request's hits refiled in its own
        order) until then or until its next call, whichever is first, so that its
        answers and state are the ones it would have without leaving anything."""
        return None


class Wrapper(Policy):
    """A policy around ``inner``: every call reaches it unchanged, so a decorator
    (an admission filter, a test's checks) overrides only the decisions it changes."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner.tiers)
        self.inner = inner

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        raise TypeError(f"{cls.__name__} wraps a policy: its from_config must build the "
                        "inner one (see kvstore.policies.filter)")

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self.inner.on_insert(info, tier, now)

    def on_insert_many(self, infos: Sequence[BlockInfo], tier: str, now: float) -> None:
        if type(self).on_insert is Wrapper.on_insert:  # a decorator that sees no insert
            self.inner.on_insert_many(infos, tier, now)
        else:
            super().on_insert_many(infos, tier, now)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        self.inner.on_access(key, tier, now)

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        if type(self).on_access is Wrapper.on_access:  # a decorator that sees no touch
            self.inner.on_access_many(keys, tiers, now)
        else:
            super().on_access_many(keys, tiers, now)

    def on_remove(self, key: Hashable, tier: str) -> None:
        self.inner.on_remove(key, tier)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterable[Hashable]:
        return self.inner.victims(tier, protected, now)

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        return self.inner.on_request(req, now)

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        return self.inner.demote_to(key, tier, now)

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        return self.inner.on_hint(hint, keys, now)

    def on_retain(self, keys: Sequence[Hashable], until: float, now: float) -> None:
        self.inner.on_retain(keys, until, now)

    def on_stored(self, keys: Sequence[Hashable], now: float) -> None:
        self.inner.on_stored(keys, now)

    def settle(self) -> None:
        self.inner.settle()


def ghost_victims(order: Iterable[Hashable], own: Container[Hashable],
                  sizes: Mapping[Hashable, int], need: int,
                  shield: Mapping[Hashable, float] | None = None) -> list[Hashable]:
    """The victims a keys-only ghost takes, in ``order``, to free ``need`` bytes: the
    engine's eviction as the ghosts play it (the request's own blocks, ``own``,
    passed over). ``shield``: the retained keys the engine's retention shield would
    keep (key -> deadline, in the order they were retained; see
    :class:`~kvstore.policies.shadow.Retained`): passed over too, and taken only when
    nothing else frees ``need``, the oldest deadline first (the latest retained first at
    one deadline), as the engine takes them."""
    gone: list[Hashable] = []
    need = _take(order, own, shield or (), sizes, need, gone)
    if need > 0 and shield:
        last = list(shield)
        last.reverse()
        last.sort(key=shield.__getitem__)  # (stable: the latest retained first at a tie)
        _take(last, own, (), sizes, need, gone)
    return gone


def _take(order: Iterable[Hashable], skip: Container[Hashable], also: Container[Hashable],
          sizes: Mapping[Hashable, int], need: int, gone: list[Hashable]) -> int:
    """``gone`` extended with the keys of ``order`` in neither ``skip`` nor ``also`` until
    ``need`` bytes are freed; returns the bytes still needed."""
    for v in order:
        if need <= 0:
            break
        if v in skip or v in also:
            continue
        gone.append(v)
        need -= sizes[v]
    return need
