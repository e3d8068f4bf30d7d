"""S3-FIFO (Yang et al., SOSP'23): a small probation FIFO, a main FIFO, a ghost list.

New blocks enter the small queue (10% of the tier); a block hit while there is
promoted to main on eviction, an unhit one is evicted and remembered in the
ghost list; a block re-inserted while in the ghost list goes straight to main.
Main is a CLOCK-like FIFO: a hit block is re-queued with its count decremented.

The CLOCK hand is lazy. :meth:`S3FIFOPolicy.victims` walks a view of the queues
(what the hand would do: promote, count down, re-queue) without touching them,
and records the steps it took as far as the engine read it; the next call into
the tier applies those steps first. So reading victims changes nothing the
policy holds, a reader may stop anywhere, and the queues end exactly where an
eager hand would have left them. A block that leaves the small queue is
remembered in the ghost list (in :meth:`~S3FIFOPolicy.on_remove`, the one place a
block leaves), unless the last walk had to leave it alone: a retained or pinned
block the engine takes when the policy's order freed too little is the engine's
choice, not a probation eviction. Children-first and protection are the engine's
(:mod:`kvstore.engine.eviction`); protected blocks are passed over unaged.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container, Hashable, Iterator, Sequence

from kvstore.policies.base import BlockInfo, Policy, TierSpec

_MAX_FREQ = 3
#: The hand's steps: re-queue at the tail of small / of main, promote small -> main,
#: count down and re-queue in main.
_SMALL, _MAIN, _PROMOTE, _AGE = range(4)


class _Queues:
    __slots__ = ("capacity", "freq", "ghost", "ghost_limit", "main", "small", "small_bytes",
                 "spared", "steps")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.small: OrderedDict[Hashable, int] = OrderedDict()
        self.main: OrderedDict[Hashable, int] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self.ghost_limit = 16
        self.freq: dict[Hashable, int] = {}
        self.small_bytes = 0
        #: the hand's steps not applied yet (the last walk, as far as it was read)
        self.steps: list[tuple[int, Hashable]] = []
        #: what the last walk had to leave alone (its ``protected``)
        self.spared: Container[Hashable] = ()


class _Ring:
    """A queue as the hand sees it: the real queue's order, then what it re-queued."""

    __slots__ = ("_items", "_tail", "n")

    def __init__(self, queue: OrderedDict[Hashable, int]) -> None:
        self._items = iter(queue.items())
        self._tail: deque[tuple[Hashable, int]] = deque()
        self.n = len(queue)

    def pop(self) -> tuple[Hashable, int]:
        for item in self._items:
            return item
        return self._tail.popleft()

    def push(self, item: tuple[Hashable, int]) -> None:
        self._tail.append(item)


class S3FIFOPolicy(Policy):
    name = "s3fifo"

    def __init__(self, tiers: Sequence[TierSpec], small_fraction: float = 0.1,
                 ghost_entries: int = 0) -> None:
        super().__init__(tiers)
        if not 0.0 < small_fraction < 1.0:
            raise ValueError(f"small_fraction must be in (0, 1), got {small_fraction}")
        self._small_fraction = small_fraction
        self._ghost_entries = ghost_entries
        self._q = {t.name: _Queues(t.capacity_bytes) for t in tiers}

    def _queues(self, tier: str) -> _Queues:
        """The tier's queues with the hand's pending steps applied."""
        q = self._q[tier]
        if q.steps:
            for step, key in q.steps:
                if step == _SMALL:
                    q.small.move_to_end(key)
                elif step == _MAIN:
                    q.main.move_to_end(key)
                elif step == _PROMOTE:
                    size = q.small.pop(key)
                    q.small_bytes -= size
                    q.freq[key] = 0
                    q.main[key] = size
                else:
                    q.freq[key] -= 1
                    q.main.move_to_end(key)
            q.steps = []
            q.ghost_limit = self._ghost_entries or max(16, len(q.freq))
        return q

    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        q = self._queues(tier)
        if info.key in q.freq:
            return
        q.freq[info.key] = 0
        if info.key in q.ghost:
            del q.ghost[info.key]
            q.main[info.key] = info.size
        else:
            q.small[info.key] = info.size
            q.small_bytes += info.size

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        q = self._queues(tier)
        if key in q.freq:
            q.freq[key] = min(q.freq[key] + 1, _MAX_FREQ)

    def on_remove(self, key: Hashable, tier: str) -> None:
        q = self._queues(tier)
        if q.freq.pop(key, None) is None:
            return
        size = q.small.pop(key, None)
        if size is not None:
            q.small_bytes -= size
            if key not in q.spared:
                q.ghost[key] = None  # evicted from probation: remembered
        else:
            q.main.pop(key, None)
        while len(q.ghost) > q.ghost_limit:
            q.ghost.popitem(last=False)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterator[Hashable]:
        """Blocks in S3-FIFO order. The walk runs on a view: each step is recorded
        (only as far as the reader goes) and applied at the next call."""
        q = self._queues(tier)
        steps: list[tuple[int, Hashable]] = []
        q.steps = steps
        q.spared = protected
        return self._walk(q, steps, protected)

    def _walk(self, q: _Queues, steps: list[tuple[int, Hashable]],
              protected: Container[Hashable]) -> Iterator[Hashable]:
        small, main = _Ring(q.small), _Ring(q.main)
        freq = q.freq
        aged: dict[Hashable, int] = {}  # the walk's counts, over ``freq``
        small_bytes = q.small_bytes
        small_target = self._small_fraction * q.capacity
        passes = 0
        budget = (small.n + main.n) * (_MAX_FREQ + 2) + 1
        skipped = 0  # protected blocks passed over in small: after a full turn, use main
        while (small.n or main.n) and passes < budget:
            passes += 1
            use_small = small_bytes >= small_target or not main.n
            if small.n and use_small and skipped < small.n:
                key, size = item = small.pop()
                if key in protected:
                    small.push(item)
                    steps.append((_SMALL, key))
                    skipped += 1
                    continue
                if aged.get(key, freq[key]) > 0:
                    small.n -= 1
                    small_bytes -= size
                    aged[key] = 0
                    main.push(item)
                    main.n += 1
                    steps.append((_PROMOTE, key))
                    continue
                small.push(item)
                steps.append((_SMALL, key))
                yield key
            elif main.n:
                key, size = item = main.pop()
                main.push(item)
                f = aged.get(key, freq[key])
                if f > 0 and key not in protected:
                    aged[key] = f - 1
                    steps.append((_AGE, key))
                    continue
                steps.append((_MAIN, key))
                yield key
            else:
                return
