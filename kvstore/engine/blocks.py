"""Blocks as the engine receives them: validation and metadata."""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvstore.engine.index import Index
from kvstore.errors import InvalidBlock, PayloadTooLarge
from kvstore.policies import BlockInfo
from kvstore.types import HASH_LENGTHS, BlockKey, BlockMeta, SessionKey, Workload, check_hash

_LENGTHS = frozenset(HASH_LENGTHS)

__all__ = ["NewBlock", "block_info", "check_blocks", "check_payload", "new_meta"]


@dataclass(frozen=True, slots=True)
class NewBlock:
    """A block to store, as the servicer hands it over (payload inline or in a slot)."""

    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    payload: bytes | memoryview
    #: Tokens in the block when no token ids are given (a trace replay); else
    #: ``len(token_ids)``.
    num_tokens: int = 0


def check_payload(block_hash: bytes, size: int, max_bytes: int) -> None:
    """A payload is neither empty nor over ``server.max_block_bytes``."""
    if size == 0:
        raise InvalidBlock(f"block {block_hash.hex()[:16]}: payload is empty")
    if size > max_bytes:
        raise PayloadTooLarge(
            f"block {block_hash.hex()[:16]}: payload of {size} bytes exceeds "
            f"server.max_block_bytes = {max_bytes}"
        )


def check_blocks(index: Index, namespace: str, blocks: Sequence[NewBlock], max_bytes: int
                 ) -> None:
    """Hash lengths (and one length per namespace), parent hashes, payload sizes."""
    index.check_hashes(namespace, [b.block_hash for b in blocks])
    parents = [b.parent_hash for b in blocks if b.parent_hash]
    if parents and not (all(isinstance(p, bytes) for p in parents)
                        and set(map(len, parents)) <= _LENGTHS):
        for p in parents:
            check_hash(p, "parent_hash")
    sizes = [len(b.payload) for b in blocks]
    if sizes and (min(sizes) == 0 or max(sizes) > max_bytes):
        for b, size in zip(blocks, sizes, strict=True):
            check_payload(b.block_hash, size, max_bytes)


#: each workload's name (an enum member's ``value`` is a property: this is a dict read)
_WORKLOAD_NAME = {w: w.value for w in Workload}


def block_info(meta: BlockMeta, prev: BlockInfo | None = None) -> BlockInfo:
    """What a policy may know of a stored block (its session a :class:`SessionKey`).
    ``prev``: the block stored before it in the same call, whose keys it takes where
    they are its parent's and its session's (a chain's blocks: no key built twice)."""
    ns = meta.key.namespace
    parent: Hashable | None = None
    if meta.parent_hash:
        parent = (prev.key if prev is not None and prev.key == (ns, meta.parent_hash)
                  else BlockKey(ns, meta.parent_hash))
    session: Hashable = ""
    if meta.session_id:
        session = (prev.session_id if prev is not None
                   and prev.session_id == (ns, meta.session_id)
                   else SessionKey(ns, meta.session_id))
    return BlockInfo(meta.key, meta.size, parent, session, _WORKLOAD_NAME[meta.workload],
                     meta.num_tokens)


def new_meta(namespace: str, b: NewBlock, checksum: int, session: str,
             workload: Workload, size: int | None = None, key: BlockKey | None = None
             ) -> BlockMeta:
    """The metadata of ``b``; ``size``: its payload's, when that is elsewhere (a
    shared-memory slot) and ``b.payload`` is empty; ``key``: its key, where the caller
    holds it already (a reservation's)."""
    tokens = tuple(b.token_ids)
    return BlockMeta(
        key or BlockKey(namespace, bytes(b.block_hash)),
        bytes(b.parent_hash) if b.parent_hash else None,
        tokens, len(b.payload) if size is None else size, checksum, session, workload,
        time.time(), len(tokens) or b.num_tokens)
