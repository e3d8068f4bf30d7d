"""A policy decorator that publishes every placement change as a block event.

:class:`EventingPolicy` wraps any :class:`~kvstore.policies.base.Policy` and
forwards every call to it unchanged. The two calls that *are* the placement
changes, ``on_insert(info, tier)`` and ``on_remove(key, tier)``, are also
recorded, and :meth:`EventingPolicy.flush` (called once per engine step: one
replayed request) hands their net effect to an
:class:`~kvstore.events.sink.EventSink` as vLLM orders it:

* removals first, one ``block_removed`` call per medium;
* then stores, one ``block_stored`` call per medium, each chain in parent ->
  child order, so the parent of a stored run was announced before it (the
  simulator stores a request's blocks tail first, vLLM's free order);
* a block stored and removed again on the same tier within the step (or
  removed and stored back) is a no-op and emits nothing.

A move HBM -> DRAM is thus a Stored on ``CPU`` and a Removed on ``GPU``.
Policy keys become :class:`~kvstore.types.BlockKey` through ``key_of``; the
default, :func:`trace_block_key`, turns a trace's int hash id into an 8-byte
big-endian hash, so the int64 form on the wire is the id itself. A trace has
no token ids: stored metas carry none (``block_size`` 0 on the wire).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Mapping, Sequence

from kvstore.events.sink import EventSink
from kvstore.policies.base import BlockInfo, Hint, Move, Policy
from kvstore.types import BlockKey, BlockMeta, Medium, Workload

__all__ = ["DEFAULT_MEDIA", "TRACE_NAMESPACE", "EventingPolicy", "trace_block_key"]

#: Tier name -> medium of the simulator's tiers.
DEFAULT_MEDIA: Mapping[str, Medium] = {"hbm": Medium.GPU, "dram": Medium.CPU,
                                       "disk": Medium.DISK}
TRACE_NAMESPACE = "trace"


def trace_block_key(key: Hashable) -> BlockKey:
    """A trace hash id (an int >= 0) as a block key with an 8-byte hash."""
    if isinstance(key, BlockKey):
        return key
    if not isinstance(key, int) or not 0 <= key < 1 << 64:
        raise ValueError(f"trace block ids must be ints in [0, 2**64), got {key!r}")
    return BlockKey(TRACE_NAMESPACE, key.to_bytes(8, "big"))


def _workload(value: str) -> Workload:
    try:
        return Workload(value.lower())
    except ValueError:
        return Workload.UNKNOWN


_REMOVED = None  # marker in the pending map: the block left the tier


class EventingPolicy(Policy):
    """Forwards to ``inner``; publishes its placement changes to ``sink`` on :meth:`flush`."""

    name = "eventing"

    def __init__(self, inner: Policy, sink: EventSink,
                 medium_by_tier: Mapping[str, Medium] = DEFAULT_MEDIA,
                 key_of: Callable[[Hashable], BlockKey] = trace_block_key) -> None:
        super().__init__(inner.tiers)
        missing = [t.name for t in inner.tiers if t.name not in medium_by_tier]
        if missing:
            raise ValueError(f"no medium for tier(s) {missing}; "
                             f"medium_by_tier has {sorted(medium_by_tier)}")
        self.inner = inner
        self.sink = sink
        self.key_of = key_of
        self._medium = {t.name: Medium(medium_by_tier[t.name]) for t in inner.tiers}
        #: (key, tier) -> (info, time) stored this step, or _REMOVED; in call order.
        self._pending: dict[tuple[Hashable, str], tuple[BlockInfo, float] | None] = {}

    # -- forwarded decisions ------------------------------------------------------
    def admit(self, info: BlockInfo, now: float) -> str | None:
        return self.inner.admit(info, now)

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        return self.inner.demote_to(key, tier, now)

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        return self.inner.on_hint(hint, keys, now)

    def on_lookup(self, keys: Sequence[Hashable], hit_tiers: Sequence[str | None],
                  info: BlockInfo, now: float) -> list[Move]:
        return self.inner.on_lookup(keys, hit_tiers, info, now)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        self.inner.on_access(key, tier, now)

    def evict(self, tier: str, nbytes: int, protected: Container[Hashable],
              now: float) -> list[Hashable] | None:
        return self.inner.evict(tier, nbytes, protected, now)

    # -- placement changes ----------------------------------------------------------
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self.inner.on_insert(info, tier, now)
        slot = (info.key, tier)
        if slot in self._pending and self._pending[slot] is _REMOVED:
            del self._pending[slot]  # removed and stored back this step: no change
        else:
            self._pending[slot] = (info, now)

    def on_remove(self, key: Hashable, tier: str) -> None:
        self.inner.on_remove(key, tier)
        slot = (key, tier)
        if slot in self._pending and self._pending[slot] is not _REMOVED:
            del self._pending[slot]  # stored and removed again this step: no change
        else:
            self._pending[slot] = _REMOVED

    # -- publishing -----------------------------------------------------------------
    def flush(self) -> None:
        """Hand the step's net placement changes to the sink (see the module docstring)."""
        if not self._pending:
            return
        removed: dict[Medium, list[BlockKey]] = {}
        stored: dict[Medium, list[BlockMeta]] = {}
        for (key, tier), entry in self._pending.items():
            medium = self._medium[tier]
            if entry is _REMOVED:
                removed.setdefault(medium, []).append(self.key_of(key))
            else:
                stored.setdefault(medium, []).append(self._meta(*entry))
        self._pending.clear()
        for medium, keys in removed.items():
            self.sink.block_removed(keys, medium)
        for medium, metas in stored.items():
            self.sink.block_stored(_chain_order(metas), medium)

    def _meta(self, info: BlockInfo, now: float) -> BlockMeta:
        parent = None if info.parent is None else self.key_of(info.parent).block_hash
        return BlockMeta(key=self.key_of(info.key), parent_hash=parent, token_ids=(),
                         size=info.size, checksum=0, session_id=info.session_id,
                         workload=_workload(info.workload), created_at=now)


def _chain_order(metas: Sequence[BlockMeta]) -> list[BlockMeta]:
    """Every parent before its children, each chain contiguous (one event per run)."""
    present = {m.key.block_hash for m in metas}
    children: dict[bytes, list[BlockMeta]] = {}
    roots: list[BlockMeta] = []
    for m in metas:
        if m.parent_hash is not None and m.parent_hash in present:
            children.setdefault(m.parent_hash, []).append(m)
        else:
            roots.append(m)
    out: list[BlockMeta] = []
    stack = list(reversed(roots))
    while stack:
        cur = stack.pop()
        out.append(cur)
        stack.extend(reversed(children.get(cur.key.block_hash, ())))
    return out
