"""Per-tier parent/child bookkeeping so victims go children first.

A block whose child is still cached in the same tier is never chosen before
that child: evicting a parent first would strand the child (a prefix stops at
its first miss). The engine's eviction manager (:mod:`kvstore.engine.eviction`)
keeps one index per tier for every policy and calls :meth:`ChildIndex.take`
with the policy's order: victims come back with every cached descendant placed
before its parent, whatever order the policy gave.

The policies' keys-only ghosts (the adaptive policy's LRU ghost, the ghosts of its
bets: :mod:`~kvstore.policies.guard`, :mod:`~kvstore.policies.shadow`) play that
same rule through :func:`ghost_take`, and learn from the stores whose children a
request's decode blocks are (:meth:`ChildIndex.link`), so that what they count is
what the engine would serve. A ghost that took a victim alone kept its descendants,
blocks no lookup could reach, and took a prompt before the output saved under it:
behind an engine cache the LRU ghost counted LRU up to 8 points short of what it
serves on reasoning traces (``scripts/ghost_error.py``). The index lives here, below
the engine, for that: one eviction rule for the engine and every model of it.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Iterable, Iterator, Mapping

from kvstore.policies.base import ghost_victims

#: Links kept for blocks not added yet (:meth:`ChildIndex.link`), at most
_EARLY = 1 << 16


class ChildIndex:
    """Parent links and cached-children counts for the blocks of one tier."""

    __slots__ = ("_children", "_early", "_epoch", "_hints", "_parent", "_sizes")

    def __init__(self) -> None:
        self._parent: dict[Hashable, Hashable | None] = {}
        self._sizes: dict[Hashable, int] = {}
        # Keyed by parent whether or not the parent is cached, so a child stored
        # before its parent is linked as soon as the parent arrives. A parent with one
        # child (every block of a chain but its last) holds a 1-tuple, a dict from the
        # second child on (keys only, in the order linked: the walks visit children in
        # this order, and a set's would follow the keys' hashes, so PYTHONHASHSEED).
        self._children: dict[Hashable, tuple[Hashable] | dict[Hashable, None]] = {}
        # Where the last walk from a root stopped (the deepest block it left), so the
        # next one starts there instead of walking down the chain again; stamped with
        # the epoch, which moves whenever a block with cached children leaves (the
        # only change that can cut the path from a root to its hint).
        self._hints: dict[Hashable, tuple[Hashable | None, int]] = {}
        self._epoch = 0
        # Links of blocks not added yet (a ghost waiting for the engine's store adds a
        # request's decode blocks after the engine said whose children they are): kept
        # until the block comes, at most _EARLY (oldest first out).
        self._early: dict[Hashable, Hashable] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def add(self, key: Hashable, parent: Hashable | None, size: int) -> None:
        self.add_many(((key, parent, size),))

    def add_many(self, items: Iterable[tuple[Hashable, Hashable | None, int]]) -> None:
        """:meth:`add` of each ``(key, parent, size)`` in turn, in one call (a store's
        blocks: a commit adds them to the engine's index and the ghosts', and a call
        per block and index, with its cycle check, was a tenth of the commit's CPU)."""
        sizes, parents, children, adopt = self._sizes, self._parent, self._children, self._adopt
        for key, parent, size in items:
            if key in sizes:
                continue
            sizes[key] = size
            parents[key] = None
            if self._early:
                early = self._early.pop(key, None)
                if parent is None:
                    parent = early
            if parent is None:
                continue
            if parent == key or (key in children and parent in parents):
                self._attach(key, parent)  # (a cycle is possible: checked there)
            else:
                # (no cycle: the key has no children, or its parent is not held, so no
                # chain of held parents leads from the parent back to the key)
                adopt(key, parent)

    def link(self, key: Hashable, parent: Hashable | None) -> None:
        """Put ``key``, held here as a chain's first block, under ``parent`` (learned
        after it was added: a ghost adds a request's decode blocks before the engine
        says whose children they are; or before: a ghost waiting for the engine's store
        adds them after, and the link waits for the block). A link that would close a
        cycle is not made."""
        self.link_many(((key, parent),))

    def link_many(self, pairs: Iterable[tuple[Hashable, Hashable | None]]) -> None:
        """:meth:`link` of each ``(key, parent)`` in turn, in one call."""
        sizes, parents, early = self._sizes, self._parent, self._early
        for key, parent in pairs:
            if parent is None:
                continue
            if key not in sizes:
                early.pop(key, None)
                early[key] = parent
                if len(early) > _EARLY:
                    del early[next(iter(early))]
            elif parents.get(key) is None:
                self._attach(key, parent)

    def _attach(self, key: Hashable, parent: Hashable) -> None:
        """``key`` (held, a chain's first block here) under ``parent``, unless that
        closes a cycle of parent links (bad input: a client stored X under Y and Y
        under X; vLLM's hashes chain, so its cannot). Such a block stays alone: a walk
        down a cycle never ends (it took the whole memory of the process on the first
        eviction that reached it). Only a block with children can close one."""
        if parent == key or (key in self._children and self._is_above(key, parent)):
            return
        self._adopt(key, parent)

    def _adopt(self, key: Hashable, parent: Hashable) -> None:
        """``key`` under ``parent`` (no cycle: checked by the caller)."""
        self._parent[key] = parent
        kids = self._children.get(parent)
        if kids is None:
            self._children[parent] = (key,)
        elif isinstance(kids, tuple):
            if kids[0] != key:
                self._children[parent] = {kids[0]: None, key: None}
        else:
            kids[key] = None

    def _is_above(self, key: Hashable, node: Hashable) -> bool:
        """Whether ``key`` is ``node`` or one of its cached ancestors (the links held
        here never form a cycle, so the walk ends; bounded all the same)."""
        parents = self._parent
        cur: Hashable | None = node
        for _ in range(len(parents) + 1):
            if cur is None:
                return False
            if cur == key:
                return True
            cur = parents.get(cur)
        return True  # (unreachable: no cycle is ever linked)

    def remove(self, key: Hashable) -> None:
        if self._sizes.pop(key, None) is None:
            return
        if key in self._children:
            self._epoch += 1
        self._hints.pop(key, None)
        parent = self._parent.pop(key, None)
        if parent is not None:
            kids = self._children.get(parent)
            if isinstance(kids, tuple):
                if kids[0] == key:
                    del self._children[parent]
            elif kids is not None:
                kids.pop(key, None)
                if not kids:
                    del self._children[parent]

    def has_children(self, key: Hashable) -> bool:
        return key in self._children

    def take(
        self,
        candidates: Iterable[Hashable],
        nbytes: int,
        protected: Container[Hashable],
    ) -> list[Hashable] | None:
        """Pick victims from ``candidates``, worst first, until ``nbytes`` are
        freed (sizes as :meth:`add` was told); descendants always precede their
        ancestors. A candidate with cached descendants gives up its subtree leaves
        first, only as much of it as is needed (its head stays when the tail is
        enough). A candidate not in the index is passed over.

        A protected block is never chosen, nor any of its ancestors (they would
        strand it). Returns ``None`` when ``nbytes`` cannot be freed (atomic:
        nothing is chosen then).
        """
        chosen: dict[Hashable, None] = {}
        kept: set[Hashable] = set()  # found to have a protected descendant
        sizes = self._sizes
        freed = 0
        for key in candidates:
            if freed >= nbytes:
                break
            if key in chosen or key in protected or key in kept:
                continue
            size = sizes.get(key)
            if size is None:
                continue
            kids = self._children.get(key)
            if kids is None or all(k in chosen for k in kids):
                chosen[key] = None  # a leaf, or every cached child goes too
                freed += size
                continue
            for k, s in self._leaves_first(key, protected, chosen, kept):
                chosen[k] = None
                freed += s
                if freed >= nbytes:
                    break
        return list(chosen) if freed >= nbytes else None

    def _leaves_first(
        self, root: Hashable, protected: Container[Hashable], chosen: Container[Hashable],
        kept: set[Hashable],
    ) -> Iterator[tuple[Hashable, int]]:
        """Root's unchosen cached subtree in post-order (children first), lazily: the
        caller stops once it has freed enough, so a shared prefix with thousands of
        cached descendants costs only the path to the leaves it takes (the whole walk
        made LRU's eviction in a two-tier replay of the conversation trace 98% of its
        run time). A protected block is left out, and so is every ancestor of it: those
        go into ``kept``, so later walks of the same call skip them (a long chain ending
        in a protected block is walked once, not once per block).

        The walk starts where the last one from ``root`` stopped (its hint) and climbs
        back to ``root`` one parent at a time once that subtree is done: evicting an
        agent session's long chain from its tail, one call per block, no longer walks
        down the whole chain per call (measured: 61% of a three-tier replay of the agent
        trace)."""
        if root not in self._sizes:
            return
        start = self._start(root, protected, chosen, kept)
        # Frames: key, its children still to visit, whether one of them must stay.
        stack: list[tuple[Hashable, Iterator[Hashable], list[bool]]] = [
            (start, iter(self._children.get(start, ())), [False])]
        while True:
            while stack:
                key, kids, keeps_child = stack[-1]
                for kid in kids:
                    if kid in chosen or kid not in self._sizes:
                        continue
                    if kid in protected or kid in kept:
                        keeps_child[0] = True
                        continue
                    stack.append((kid, iter(self._children.get(kid, ())), [False]))
                    break
                else:
                    stack.pop()
                    if keeps_child[0]:
                        kept.add(key)
                        if stack:
                            stack[-1][2][0] = True
                        continue
                    if key != root:
                        self._hints[root] = (self._parent.get(key), self._epoch)
                    yield key, self._sizes[key]
            if start == root:
                return
            # start's subtree is done: go on with its parent's other children, then it.
            parent = self._parent.get(start)
            if parent is None or parent not in self._sizes:
                # The path up from the hint is cut: its block came back after its parent
                # left (or under another parent, bad input). Walk from root instead.
                self._hints.pop(root, None)
                start = root
            else:
                start = parent
                if start in protected or start in kept:
                    self._keep_up(start, root, kept)
                    return
            stack.append((start, iter(self._children.get(start, ())), [False]))

    def _start(self, root: Hashable, protected: Container[Hashable],
               chosen: Container[Hashable], kept: set[Hashable]) -> Hashable:
        """Root's hint if it still lies under root (and may be walked), else root."""
        hint = self._hints.get(root)
        if hint is None:
            return root
        node, epoch = hint
        if (node is None or node not in self._sizes or node in chosen or node in protected
                or node in kept):
            return root
        if epoch != self._epoch:  # a block with children left: is the path still there?
            up: Hashable | None = node
            for _ in range(len(self._sizes)):  # bounded: parent links may form a cycle
                if up is None or up == root:
                    break
                up = self._parent.get(up)
            if up != root:
                del self._hints[root]
                return root
            self._hints[root] = (node, self._epoch)
        return node

    def _keep_up(self, key: Hashable, root: Hashable, kept: set[Hashable]) -> None:
        """``key`` must stay (protected, or above one): so must every ancestor up to root."""
        node: Hashable | None = key
        while node is not None:
            kept.add(node)
            if node == root:
                return
            node = self._parent.get(node)


#: Rounds of :func:`ghost_take`'s room-making, as the engine's (``_MAX_EVICTION_ROUNDS``)
_ROUNDS = 64


class _Either:
    """Membership in either of two containers (the request's own keys, the shield)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container[Hashable], b: Container[Hashable]) -> None:
        self.a, self.b = a, b

    def __contains__(self, key: object) -> bool:
        return key in self.a or key in self.b


def ghost_take(children: ChildIndex, order: Callable[[], Iterable[Hashable]],
               own: Container[Hashable], sizes: Mapping[Hashable, int], need: int,
               shield: Mapping[Hashable, float] | None = None) -> list[Hashable]:
    """The victims the engine would take from a keys-only ghost whose blocks
    ``children`` indexes (``sizes``: key -> bytes), to free ``need`` bytes, as its
    room-making does (:mod:`kvstore.engine.room`): ``order()`` (the ghost's policy's
    order, worst first) read as the eviction manager reads it (every cached
    descendant before its ancestor, only as much of a subtree as it takes; the
    request's own blocks, ``own``, and their ancestors kept), the retention shield's
    keys (key -> deadline, in the order retained) kept as well. When that cannot free
    ``need``, retained keys go first, the oldest deadline first (the latest retained
    first at one deadline), as few as leave the rest enough (at least one), and the
    rest is taken again (the retained keys that go are removed from ``children`` here;
    the caller removes the rest). Where nothing more can go (the request's own blocks
    fill the ghost), the keys :func:`ghost_victims` gives."""
    out: list[Hashable] = []
    if need <= 0:
        return out
    if not shield:
        got = children.take(order(), need, own)
        return got if got is not None else ghost_victims(order(), own, sizes, need)
    left = dict(shield)
    for _ in range(_ROUNDS):
        got = children.take(order(), need, _Either(own, left) if left else own)
        if got is not None:
            return out + got
        if not left:
            break
        # (the engine's retention gives up the oldest deadlines first, as few as leave
        # the unshielded bytes enough: ``short``)
        short = need - (sum(sizes.values()) - sum(sizes.get(k, 0) for k in out)
                        - sum(sizes.get(k, 0) for k in left))
        last = list(left)
        last.reverse()
        last.sort(key=left.__getitem__)  # (stable: the latest retained first at a tie)
        freed = 0
        for k in last:
            if freed >= max(short, 1):
                break
            if k in own or k not in sizes:
                continue
            out.append(k)
            children.remove(k)  # (gone: the next round's walk must not take it again)
            del left[k]
            freed += sizes[k]
            need -= sizes[k]
        if need <= 0 or not freed:
            break
    if need <= 0:
        return out
    gone = set(out)
    rest = ghost_victims((k for k in order() if k not in gone), own, sizes, need, left)
    return out + rest

