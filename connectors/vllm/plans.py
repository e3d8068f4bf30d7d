"""What the scheduler side asks the workers to move: plain, picklable plans.

No vLLM here, so the worker's data path imports (and is tested) without it;
:mod:`.metadata` wraps these in vLLM's metadata classes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BlockSave", "LoadPlan", "SavePlan"]


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """Copy ``hashes[i]`` from the sidecar into engine block ``block_ids[i]``."""

    req_id: str
    hashes: tuple[bytes, ...]
    block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlockSave:
    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    block_id: int


@dataclass(frozen=True, slots=True)
class SavePlan:
    """Blocks of one request that became full this step, to store after the forward."""

    req_id: str
    session_id: str
    workload: str
    blocks: tuple[BlockSave, ...]
