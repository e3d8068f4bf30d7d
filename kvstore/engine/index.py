"""The block index: per namespace, which blocks exist and in which tiers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from kvstore.errors import InvalidBlock, NamespaceNotFound
from kvstore.policies.base import BlockInfo
from kvstore.types import HASH_LENGTHS, BlockKey, BlockMeta, check_hash

__all__ = ["Entry", "Index", "chain_order", "reachable"]


@dataclass(slots=True)
class Entry:
    """One stored block: its metadata and the tiers (fastest first) holding it."""

    meta: BlockMeta
    tiers: list[str] = field(default_factory=list)
    #: What the policy is told about the block (made once, on its first store).
    info: BlockInfo | None = None

    @property
    def key(self) -> BlockKey:
        return self.meta.key


@dataclass(slots=True)
class _Namespace:
    hash_len: int
    blocks: dict[bytes, Entry] = field(default_factory=dict)


_EMPTY: dict[bytes, Entry] = {}


class Index:
    """Namespaces -> hash -> :class:`Entry`. Tier order is given at construction."""

    def __init__(self, tier_order: list[str]) -> None:
        self._rank = {name: i for i, name in enumerate(tier_order)}
        self._ns: dict[str, _Namespace] = {}
        #: blocks per tier, kept as locations change (stats never scan the index)
        self.tier_blocks: dict[str, int] = dict.fromkeys(tier_order, 0)
        #: Told ``(namespace, tier, +-bytes)`` as a location is added or removed (the
        #: engine's per-tenant quotas count usage this way).
        self.on_bytes: Callable[[str, str, int], None] | None = None

    # -- validation -------------------------------------------------------------
    def check_hashes(self, namespace: str, hashes: list[bytes], *, create: bool = False) -> None:
        """Validate hash lengths (and that a namespace keeps one length)."""
        if not namespace:
            raise InvalidBlock("namespace must be a non-empty string")
        if not hashes:
            return
        lengths = set(map(len, hashes))
        for h in hashes[:1]:
            check_hash(h)
        if len(lengths) > 1 or not lengths <= set(HASH_LENGTHS):
            for h in hashes:
                check_hash(h)
        ns = self._ns.get(namespace)
        want = ns.hash_len if ns else len(hashes[0])
        if lengths != {want}:
            got = sorted(lengths - {want})[0]
            raise InvalidBlock(
                f"namespace {namespace!r} uses {want}-byte block hashes, got {got} bytes; "
                "one namespace cannot mix hash functions"
            )
        if create and ns is None:
            self._ns[namespace] = _Namespace(hash_len=want)

    def require_namespace(self, namespace: str) -> None:
        if namespace not in self._ns:
            raise NamespaceNotFound(
                f"namespace {namespace!r} has no blocks (known: {len(self._ns)} namespaces)"
            )

    # -- queries ----------------------------------------------------------------
    def get(self, key: BlockKey) -> Entry | None:
        ns = self._ns.get(key.namespace)
        return ns.blocks.get(key.block_hash) if ns else None

    def get_hash(self, namespace: str, block_hash: bytes) -> Entry | None:
        ns = self._ns.get(namespace)
        return ns.blocks.get(block_hash) if ns else None

    def blocks_of(self, namespace: str) -> dict[bytes, Entry]:
        """hash -> entry of one namespace (empty if unknown); read-only use."""
        ns = self._ns.get(namespace)
        return ns.blocks if ns is not None else _EMPTY

    def namespaces(self) -> list[str]:
        return list(self._ns)

    def entries(self, namespace: str | None = None) -> Iterator[Entry]:
        spaces = [self._ns[namespace]] if namespace in self._ns else (
            [] if namespace is not None else list(self._ns.values()))
        for ns in spaces:
            yield from list(ns.blocks.values())

    def __len__(self) -> int:
        return sum(len(ns.blocks) for ns in self._ns.values())

    # -- updates ----------------------------------------------------------------
    def add_location(self, meta: BlockMeta, tier: str) -> Entry:
        ns = self._ns.get(meta.key.namespace)
        if ns is None:
            ns = self._ns[meta.key.namespace] = _Namespace(hash_len=len(meta.key.block_hash))
        entry = ns.blocks.get(meta.key.block_hash)
        if entry is None:
            entry = ns.blocks[meta.key.block_hash] = Entry(meta)
        if tier not in entry.tiers:
            entry.tiers.append(tier)
            entry.tiers.sort(key=self._rank.__getitem__)
            self.tier_blocks[tier] += 1
            if self.on_bytes is not None:
                self.on_bytes(meta.key.namespace, tier, entry.meta.size)
        return entry

    def remove_location(self, key: BlockKey, tier: str) -> Entry | None:
        """Drop one location; the entry goes when it has none. Returns the entry."""
        ns = self._ns.get(key.namespace)
        entry = ns.blocks.get(key.block_hash) if ns else None
        if entry is None:
            return None
        if tier in entry.tiers:
            entry.tiers.remove(tier)
            self.tier_blocks[tier] -= 1
            if self.on_bytes is not None:
                self.on_bytes(key.namespace, tier, -entry.meta.size)
        if not entry.tiers and ns is not None:
            del ns.blocks[key.block_hash]
            if not ns.blocks:
                del self._ns[key.namespace]
        return entry


def chain_order(metas: Sequence[BlockMeta]) -> list[BlockMeta]:
    """Order metas so every parent comes before its children (recovery events)."""
    by_key = {m.key: m for m in metas}
    out: list[BlockMeta] = []
    seen: set[BlockKey] = set()
    for m in metas:
        stack = []
        cur: BlockMeta | None = m
        while cur is not None and cur.key not in seen:
            stack.append(cur)
            seen.add(cur.key)
            cur = (by_key.get(BlockKey(cur.key.namespace, cur.parent_hash))
                   if cur.parent_hash else None)
        out.extend(reversed(stack))
    return out


def reachable(metas: Sequence[BlockMeta]) -> tuple[list[BlockMeta], list[BlockMeta]]:
    """Split recovered blocks into those a prefix lookup can reach (every ancestor
    present; parents before children) and the orphans (a crash or an eviction
    left a hole above them, or their parents form a cycle)."""
    by_key = {m.key: m for m in metas}
    state: dict[BlockKey, bool] = {}
    for m in metas:
        path: list[BlockKey] = []
        on_path: set[BlockKey] = set()
        cur: BlockMeta | None = m
        ok = True
        while cur is not None:
            if cur.key in state:
                ok = state[cur.key]
                break
            if cur.key in on_path:
                ok = False  # a cycle: no chain from a first block leads here
                break
            path.append(cur.key)
            on_path.add(cur.key)
            if cur.parent_hash is None:
                break
            cur = by_key.get(BlockKey(cur.key.namespace, cur.parent_hash))
            if cur is None:
                ok = False
        for k in path:
            state[k] = ok
    good = [m for m in metas if state[m.key]]
    return chain_order(good), [m for m in metas if not state[m.key]]
