"""What the scheduler side asks the workers to move: plain, picklable plans.

No vLLM here, so the worker's data path imports (and is tested) without it;
:mod:`.metadata` wraps these in vLLM's metadata classes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BlockSave", "LoadPlan", "SavePlan"]


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """Copy ``hashes[i]`` from the sidecar into engine block ``block_ids[i]``.

    ``asynchronous``: off the step (the request waits in vLLM's
    ``WAITING_FOR_REMOTE_KVS`` until ``get_finished`` reports it); otherwise before
    the forward that reads the blocks."""

    req_id: str
    hashes: tuple[bytes, ...]
    block_ids: tuple[int, ...]
    asynchronous: bool = False


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
