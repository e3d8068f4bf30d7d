"""What the scheduler side tells the workers each step, and what they report back.

Plain picklable dataclasses: vLLM ships them between processes. They subclass
vLLM's metadata bases; where vLLM is not installed (the worker's data-path
tests, ``scripts/gpu_check.sh`` on a torch-only GPU machine) plain stand-ins
take their place, so the worker side runs without vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.connectors.vllm.plans import BlockSave, LoadPlan, SavePlan

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorMetadata,
        KVConnectorWorkerMetadata,
    )
except ImportError:  # no vLLM: the worker side's tests

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        pass

__all__ = ["BlockSave", "KVStoreConnectorMetadata", "LoadPlan", "SavePlan", "WorkerReport"]


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadPlan] = field(default_factory=list)
    saves: list[SavePlan] = field(default_factory=list)
    #: Finished requests whose blocks the engine keeps until the workers report
    #: them (``get_finished``): req id -> hold seconds (0: until their saves are done).
    holds: dict[str, float] = field(default_factory=dict)
    #: Requests preempted this step: their blocks are reused by this step's forward.
    preempted: set[str] = field(default_factory=set)
    #: No tokens are scheduled this step (the engine steps only to poll transfers).
    idle: bool = False

    def is_empty(self) -> bool:
        return not (self.loads or self.saves or self.holds or self.preempted)


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
    #: Wall time and bytes of the save jobs that finished this step (the slowest
    #: worker's), whatever requests they were for.
    save_ms: float = 0.0
    save_bytes: int = 0

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
        merged.save_ms = max(self.save_ms, other.save_ms)
        merged.save_bytes = max(self.save_bytes, other.save_bytes)
        return merged

    def is_empty(self) -> bool:
        return not (
            self.loaded or self.load_failed or self.saved or self.save_failed or self.save_bytes
        )
