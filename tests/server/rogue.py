"""A rogue writer: flips a byte of a stored block through the server's DRAM mapping, as
a process that kept writing into a slot after its reservation ended would."""

from __future__ import annotations

from typing import Any

from kvstore.types import BlockKey


def corrupt_in_dram(server: Any, namespace: str, block_hash: bytes, at: int = 0) -> None:
    """Flip byte ``at`` of the block's stored DRAM copy (call ``server.drain()`` first, so
    the block's write-back has read the good bytes)."""
    dram = server.engine.tiers["dram"].unwrap()
    dram.view(dram.locate(BlockKey(namespace, block_hash)))[at] ^= 0xFF
