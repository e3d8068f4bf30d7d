"""What the scheduler side tells the workers each step, and what they report back.

Plain picklable dataclasses: vLLM ships them between processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

__all__ = ["BlockSave", "KVStoreConnectorMetadata", "LoadPlan", "SavePlan", "WorkerReport"]


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


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadPlan] = field(default_factory=list)
    saves: list[SavePlan] = field(default_factory=list)
    #: Finished requests whose blocks the engine holds: req id -> hold seconds.
    holds: dict[str, float] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (self.loads or self.saves or self.holds)


@dataclass
class WorkerReport(KVConnectorWorkerMetadata):
    """Per-request block counts of one step, summed over workers."""

    loaded: dict[str, int] = field(default_factory=dict)
    load_failed: dict[str, int] = field(default_factory=dict)
    saved: dict[str, int] = field(default_factory=dict)
    save_failed: dict[str, int] = field(default_factory=dict)
    #: Wall time and bytes of each request's load (the slowest worker's).
    load_ms: dict[str, float] = field(default_factory=dict)
    load_bytes: dict[str, int] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if not isinstance(other, WorkerReport):
            return self
        merged = WorkerReport()
        for name in ("loaded", "load_failed", "saved", "save_failed"):
            # Every worker moves its own shard of the same blocks: a block
            # counts once, as the least any worker managed.
            mine, theirs = getattr(self, name), getattr(other, name)
            target = getattr(merged, name)
            for req_id in mine.keys() | theirs.keys():
                if name.endswith("failed"):
                    target[req_id] = max(mine.get(req_id, 0), theirs.get(req_id, 0))
                else:
                    target[req_id] = min(mine.get(req_id, 0), theirs.get(req_id, 0))
        for name in ("load_ms", "load_bytes"):
            mine, theirs = getattr(self, name), getattr(other, name)
            target = getattr(merged, name)
            for req_id in mine.keys() | theirs.keys():
                target[req_id] = max(mine.get(req_id, 0), theirs.get(req_id, 0))
        return merged

    def is_empty(self) -> bool:
        return not (self.loaded or self.load_failed or self.saved or self.save_failed)
