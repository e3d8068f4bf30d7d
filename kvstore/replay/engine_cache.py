"""The inference engine's own prefix cache, modelled as vLLM's (replay only).

In a deployment the GPU tier is not the sidecar's: it is vLLM's KV cache. Every
block a request computes or loads enters it; a running request's blocks are
pinned (reference counts, shared between requests with a common prefix); when a
request finishes its blocks join the free queue, evicted least recently freed
first, and within one request tail first (vLLM frees a request's blocks in
reverse order so that a prefix outlives its suffix). The sidecar's only lever is
the keep: the connector holds a finished request's blocks for the ``keep_s`` its
lookup got, capped by ``hold_max_s``, while the blocks held stay within
``hold_budget`` (``connectors/vllm/scheduler.py``: ``_hold_ms``). No policy is
asked what enters or leaves this cache.

Blocks are trace block ids (ints). A request caches only the blocks that find
room (an empty slot or a free one to evict); when running requests pin every
slot, the rest are computed and not cached (vLLM would make the request wait;
the replay does not gate on room, see :mod:`kvstore.replay.served`).

A prompt's partial last block takes a slot too while its request holds it (vLLM
allocates it like any other), but it has no hash: nothing matches it, and when it
is freed vLLM puts it at the front of the free queue (reused first, evicting
nothing), which is an empty slot here. It is held under a negative id of its own
(trace ids are never negative). ``capacity`` is the blocks requests can use:
vLLM's ``num_gpu_blocks`` minus its null block (``BlockPool.null_block``).

A :class:`CacheListener` hears what vLLM publishes about this cache (its
``BlockStored`` / ``BlockRemoved`` events, medium ``GPU``): a block is stored
when it enters the cache (computed or loaded; a hit on a cached block is not
news), one call per run of consecutive new blocks with the block before the run
as parent, and removed when it is evicted to make room (a block freed into the
queue stays cached, and matched, until then). Partial blocks, hashless, are never
announced. The listener is told the evictions of one allocation before the blocks
it stores, as vLLM evicts while allocating and announces after.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

__all__ = ["CacheListener", "EngineCache"]


class CacheListener(Protocol):
    """What the engine cache announces (see the module docstring)."""

    def stored(self, blocks: Sequence[int], parent: int | None) -> None: ...

    def removed(self, blocks: Sequence[int]) -> None: ...


class EngineCache:
    """vLLM's prefix cache over ``capacity`` blocks, with the connector's holds."""

    __slots__ = ("capacity", "hold_budget", "hold_max_s", "listener", "_ref", "_free",
                 "_holds", "_held_blocks", "_partials", "hits", "holds_made", "holds_refused")

    def __init__(self, capacity: int, hold_budget: int = 0, hold_max_s: float = 0.0,
                 listener: CacheListener | None = None) -> None:
        if capacity < 0 or hold_budget < 0 or hold_max_s < 0:
            raise ValueError(f"engine cache: capacity {capacity}, hold_budget {hold_budget} "
                             f"and hold_max_s {hold_max_s} must be >= 0")
        self.capacity = capacity
        self.hold_budget = hold_budget
        self.hold_max_s = hold_max_s
        self.listener = listener
        #: Block -> references (running requests and holds); 0: in the free queue.
        self._ref: dict[int, int] = {}
        #: Evictable blocks, first evicted first (vLLM's free block queue).
        self._free: OrderedDict[int, None] = OrderedDict()
        #: Request id -> (hold end, blocks held).
        self._holds: dict[str, tuple[float, tuple[int, ...]]] = {}
        self._held_blocks = 0
        #: Ids given to partial blocks (-1, -2, ...): hashless, never matched.
        self._partials = 0
        self.hits = 0
        self.holds_made = 0
        self.holds_refused = 0

    def __contains__(self, block: int) -> bool:
        return block in self._ref

    def __len__(self) -> int:
        return len(self._ref)

    @property
    def held_blocks(self) -> int:
        return self._held_blocks

    def cached(self) -> set[int]:
        """The blocks the cache holds that have a hash (pinned, held or free)."""
        return {b for b in self._ref if b >= 0}

    def match(self, blocks: Sequence[int]) -> int:
        """Blocks of the longest cached prefix of ``blocks``."""
        ref = self._ref
        n = 0
        for b in blocks:
            if b not in ref:
                break
            n += 1
        return n

    def room(self) -> int:
        """Blocks a new request may take now (empty slots and the free queue)."""
        return self.capacity - len(self._ref) + len(self._free)

    def acquire(self, blocks: Sequence[int], partial: bool = False,
                parent: int | None = None) -> tuple[int, ...]:
        """Pin ``blocks`` for a running request (cached ones are reused, the others
        allocated, evicting from the free queue); returns the blocks it holds. Blocks
        that find no room (every slot pinned) are not cached. ``partial``: the prompt
        also has a partial last block, which takes a slot of its own (see above).
        ``parent``: the block before ``blocks[0]`` in its chain (for the listener)."""
        ref = self._ref
        free = self._free
        listener = self.listener
        took: list[int] = []
        evicted: list[int] = []
        new: list[int] = []
        if partial:
            self._partials += 1
            blocks = [*blocks, -self._partials]
        for b in blocks[:self.capacity]:
            n = ref.get(b)
            if n is None:
                if len(ref) >= self.capacity:
                    if not free:
                        break
                    victim, _ = free.popitem(last=False)
                    del ref[victim]
                    evicted.append(victim)
                ref[b] = 1
                new.append(b)
            else:
                if n == 0:
                    del free[b]
                ref[b] = n + 1
            took.append(b)
        if listener is not None and (evicted or new):
            self._announce(listener, blocks, took, evicted, set(new), parent)
        return tuple(took)

    @staticmethod
    def _announce(listener: CacheListener, blocks: Sequence[int], took: Sequence[int],
                  evicted: Sequence[int], new: set[int], parent: int | None) -> None:
        """Evictions first, then each run of consecutive new hashed blocks."""
        if evicted:
            listener.removed(evicted)
        run: list[int] = []
        before = parent
        for i, b in enumerate(took):
            if b in new and b >= 0:
                if not run:
                    before = blocks[i - 1] if i else parent
                run.append(b)
            elif run:
                listener.stored(run, before)
                run = []
        if run:
            listener.stored(run, before)

    def extend(self, held: tuple[int, ...], blocks: Sequence[int],
               parent: int | None = None) -> tuple[int, ...]:
        """Add a running request's newly filled ``blocks`` (decode) to what it holds;
        ``parent``: the block they follow (the prompt's last full block)."""
        if not blocks:
            return held
        return held + self.acquire(blocks, parent=parent)

    def release(self, blocks: Sequence[int]) -> None:
        """A request's references end: its unshared blocks join the free queue, tail
        first (evicted before the prefix)."""
        ref = self._ref
        free = self._free
        for b in reversed(blocks):
            n = ref.get(b)
            if n is None:
                continue
            if n <= 1 and b < 0:  # a partial block: freed to the front, an empty slot
                del ref[b]
            elif n <= 1:
                ref[b] = 0
                free[b] = None
            else:
                ref[b] = n - 1

    def finish(self, request_id: str, blocks: tuple[int, ...], keep_s: float, now: float
               ) -> float:
        """A request finished: hold its blocks for ``keep_s`` (capped by ``hold_max_s``)
        if they fit in the hold budget, else release them. Returns the hold granted."""
        keep = min(keep_s, self.hold_max_s)
        if keep <= 0 or not blocks or self.hold_budget <= 0:
            self.release(blocks)
            return 0.0
        self.expire(now)
        if self._held_blocks + len(blocks) > self.hold_budget:
            self.holds_refused += 1
            self.release(blocks)
            return 0.0
        self._holds[request_id] = (now + keep, blocks)  # the running reference carries over
        self._held_blocks += len(blocks)
        self.holds_made += 1
        return keep

    def expire(self, now: float) -> None:
        """Release the holds that ended by ``now``."""
        if not self._holds:
            return
        done = [r for r, (end, _) in self._holds.items() if end <= now]
        for r in sorted(done, key=lambda r: self._holds[r][0]):
            _, blocks = self._holds.pop(r)
            self._held_blocks -= len(blocks)
            self.release(blocks)

    def next_expiry(self) -> float | None:
        return min((end for end, _ in self._holds.values()), default=None)
