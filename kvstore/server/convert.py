"""Translation between wire messages and domain objects (nothing else)."""

from __future__ import annotations

from typing import Any

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.engine.blocks import NewBlock
from kvstore.errors import InvalidBlock
from kvstore.tiers.base import Slot
from kvstore.types import BlockMeta, Medium

__all__ = [
    "MEDIUM_TO_PB", "PB_TO_MEDIUM", "add_header", "add_slot", "header_to_pb", "new_block",
    "slot_from_pb",
]

MEDIUM_TO_PB = {
    Medium.GPU: pb.MEDIUM_GPU,
    Medium.CPU: pb.MEDIUM_CPU,
    Medium.DISK: pb.MEDIUM_DISK,
    Medium.REMOTE: pb.MEDIUM_REMOTE,
}
PB_TO_MEDIUM = {v: k for k, v in MEDIUM_TO_PB.items()}


def new_block(header: pb.BlockHeader, payload: bytes | memoryview = b"",
              max_tokens: int | None = None) -> NewBlock:
    """The domain block of a header; ``max_tokens`` is checked before the token ids
    are copied (a header may carry millions: a copy of them costs ~36 bytes each)."""
    if not header.block_hash:
        raise InvalidBlock("block header has an empty block_hash")
    tokens = header.token_ids
    if max_tokens is not None and len(tokens) > max_tokens:
        raise InvalidBlock(
            f"block {bytes(header.block_hash).hex()[:16]} carries {len(tokens)} "
            f"token ids; a block may carry at most {max_tokens} (server.max_block_tokens)")
    # (a slice of a repeated field is a list made in C: half the cost of iterating it)
    return NewBlock(header.block_hash, header.parent_hash or None, tuple(tokens[:]), payload)


def _header_fields(meta: BlockMeta) -> dict[str, Any]:
    """A ``BlockHeader``'s fields for ``meta``: one mapping for both builders below (the
    dict costs ~0.2 us a header: 2.33 against 2.15 us for 512 built in place)."""
    return {
        "block_hash": meta.key.block_hash,
        "parent_hash": meta.parent_hash or b"",
        "token_ids": meta.token_ids,
        "size": meta.size,
        "checksum": meta.checksum,
        "session_id": meta.session_id,
        "workload": meta.workload.value,
    }


def header_to_pb(meta: BlockMeta) -> pb.BlockHeader:
    return pb.BlockHeader(**_header_fields(meta))


# A response's per-block messages are built in place in their repeated field (``add``):
# a message built and then appended is copied into the field, which about doubles its
# cost (measured here, 512 blocks of an Acquire's descriptor and header: 1.65 us a
# block built in place, 3.0 us appended, 2.6 us passed as lists to the constructor).


def add_header(headers: Any, meta: BlockMeta) -> None:
    """Append ``meta``'s header to a repeated ``BlockHeader`` field, built in place."""
    headers.add(**_header_fields(meta))


def add_slot(slots: Any, slot: Slot, block_hash: bytes = b"", checksum: int = 0) -> None:
    """Append ``slot``'s descriptor to a repeated ``SlotDescriptor`` field, built in
    place."""
    slots.add(segment=slot.segment, offset=slot.offset, length=slot.length,
              block_hash=block_hash, checksum=checksum, slot_id=slot.slot_id)


def slot_from_pb(d: pb.SlotDescriptor) -> Slot:
    return Slot(d.slot_id, d.segment, d.offset, d.length)
