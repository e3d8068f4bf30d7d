from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Medium(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEDIUM_UNSPECIFIED: _ClassVar[Medium]
    MEDIUM_GPU: _ClassVar[Medium]
    MEDIUM_CPU: _ClassVar[Medium]
    MEDIUM_DISK: _ClassVar[Medium]
    MEDIUM_REMOTE: _ClassVar[Medium]
MEDIUM_UNSPECIFIED: Medium
MEDIUM_GPU: Medium
MEDIUM_CPU: Medium
MEDIUM_DISK: Medium
MEDIUM_REMOTE: Medium

class BlockHeader(_message.Message):
    __slots__ = ("block_hash", "parent_hash", "token_ids", "size", "checksum", "session_id", "workload")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    block_hash: bytes
    parent_hash: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    size: int
    checksum: int
    session_id: str
    workload: str
    def __init__(self, block_hash: _Optional[bytes] = ..., parent_hash: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., size: _Optional[int] = ..., checksum: _Optional[int] = ..., session_id: _Optional[str] = ..., workload: _Optional[str] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("header", "payload")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    header: BlockHeader
    payload: bytes
    def __init__(self, header: _Optional[_Union[BlockHeader, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class SlotDescriptor(_message.Message):
    __slots__ = ("segment", "offset", "length", "block_hash", "checksum", "slot_id")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SLOT_ID_FIELD_NUMBER: _ClassVar[int]
    segment: str
    offset: int
    length: int
    block_hash: bytes
    checksum: int
    slot_id: int
    def __init__(self, segment: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., block_hash: _Optional[bytes] = ..., checksum: _Optional[int] = ..., slot_id: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("namespace", "block_hashes", "session_id", "workload", "request_id", "num_tokens", "then", "tool", "expected_gap_ms", "hold", "lease_seconds", "num_computed_tokens")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    THEN_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_GAP_MS_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    session_id: str
    workload: str
    request_id: str
    num_tokens: int
    then: str
    tool: str
    expected_gap_ms: float
    hold: bool
    lease_seconds: float
    num_computed_tokens: int
    def __init__(self, namespace: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., session_id: _Optional[str] = ..., workload: _Optional[str] = ..., request_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., then: _Optional[str] = ..., tool: _Optional[str] = ..., expected_gap_ms: _Optional[float] = ..., hold: bool = ..., lease_seconds: _Optional[float] = ..., num_computed_tokens: _Optional[int] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("num_hit", "media", "store_blocks", "keep_ms", "held")
    NUM_HIT_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    STORE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KEEP_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    num_hit: int
    media: _containers.RepeatedScalarFieldContainer[Medium]
    store_blocks: int
    keep_ms: float
    held: AcquireResponse
    def __init__(self, num_hit: _Optional[int] = ..., media: _Optional[_Iterable[_Union[Medium, str]]] = ..., store_blocks: _Optional[int] = ..., keep_ms: _Optional[float] = ..., held: _Optional[_Union[AcquireResponse, _Mapping]] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("namespace", "blocks", "session_id", "workload", "request_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    session_id: str
    workload: str
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., session_id: _Optional[str] = ..., workload: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("stored", "existing")
    STORED_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    stored: int
    existing: int
    def __init__(self, stored: _Optional[int] = ..., existing: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("namespace", "block_hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("blocks", "indices")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., indices: _Optional[_Iterable[int]] = ...) -> None: ...

class SegmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SegmentInfo(_message.Message):
    __slots__ = ("name", "size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class SegmentsResponse(_message.Message):
    __slots__ = ("segments", "host_id", "packed_commit")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PACKED_COMMIT_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    host_id: str
    packed_commit: bool
    def __init__(self, segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., host_id: _Optional[str] = ..., packed_commit: bool = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("namespace", "sizes", "block_hashes", "session_id", "workload", "request_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    sizes: _containers.RepeatedScalarFieldContainer[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    session_id: str
    workload: str
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., sizes: _Optional[_Iterable[int]] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., session_id: _Optional[str] = ..., workload: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("slots", "lease_seconds")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[SlotDescriptor]
    lease_seconds: float
    def __init__(self, slots: _Optional[_Iterable[_Union[SlotDescriptor, _Mapping]]] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("namespace", "slots", "headers", "session_id", "workload", "request_id", "slot_ids", "checksums")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    slots: _containers.RepeatedCompositeFieldContainer[SlotDescriptor]
    headers: _containers.RepeatedCompositeFieldContainer[BlockHeader]
    session_id: str
    workload: str
    request_id: str
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., slots: _Optional[_Iterable[_Union[SlotDescriptor, _Mapping]]] = ..., headers: _Optional[_Iterable[_Union[BlockHeader, _Mapping]]] = ..., session_id: _Optional[str] = ..., workload: _Optional[str] = ..., request_id: _Optional[str] = ..., slot_ids: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    def __init__(self, stored: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("slot_ids",)
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slot_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("namespace", "block_hashes", "lease_seconds")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    lease_seconds: float
    def __init__(self, namespace: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("lease_id", "slots", "headers", "lease_seconds")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    slots: _containers.RepeatedCompositeFieldContainer[SlotDescriptor]
    headers: _containers.RepeatedCompositeFieldContainer[BlockHeader]
    lease_seconds: float
    def __init__(self, lease_id: _Optional[int] = ..., slots: _Optional[_Iterable[_Union[SlotDescriptor, _Mapping]]] = ..., headers: _Optional[_Iterable[_Union[BlockHeader, _Mapping]]] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "corrupt_hashes")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_HASHES_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    corrupt_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, lease_id: _Optional[int] = ..., corrupt_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("corrupt",)
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    corrupt: int
    def __init__(self, corrupt: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("namespace", "block_hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class HintRequest(_message.Message):
    __slots__ = ("session_id", "event", "workload", "tool", "expected_gap_ms", "namespace", "request_id", "output_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_GAP_MS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    event: str
    workload: str
    tool: str
    expected_gap_ms: float
    namespace: str
    request_id: str
    output_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., event: _Optional[str] = ..., workload: _Optional[str] = ..., tool: _Optional[str] = ..., expected_gap_ms: _Optional[float] = ..., namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class HintResponse(_message.Message):
    __slots__ = ("moves",)
    MOVES_FIELD_NUMBER: _ClassVar[int]
    moves: int
    def __init__(self, moves: _Optional[int] = ...) -> None: ...

class RetainRequest(_message.Message):
    __slots__ = ("namespace", "block_hashes", "ttl_s")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    ttl_s: float
    def __init__(self, namespace: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class RetainResponse(_message.Message):
    __slots__ = ("protected",)
    PROTECTED_FIELD_NUMBER: _ClassVar[int]
    protected: int
    def __init__(self, protected: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("loop_lag_window_s",)
    LOOP_LAG_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    loop_lag_window_s: float
    def __init__(self, loop_lag_window_s: _Optional[float] = ...) -> None: ...

class LoopLag(_message.Message):
    __slots__ = ("samples", "p50_ms", "p99_ms", "max_ms", "busy_samples", "busy_p50_ms", "busy_p99_ms", "busy_max_ms")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    BUSY_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BUSY_P50_MS_FIELD_NUMBER: _ClassVar[int]
    BUSY_P99_MS_FIELD_NUMBER: _ClassVar[int]
    BUSY_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    busy_samples: int
    busy_p50_ms: float
    busy_p99_ms: float
    busy_max_ms: float
    def __init__(self, samples: _Optional[int] = ..., p50_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., max_ms: _Optional[float] = ..., busy_samples: _Optional[int] = ..., busy_p50_ms: _Optional[float] = ..., busy_p99_ms: _Optional[float] = ..., busy_max_ms: _Optional[float] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("name", "medium", "capacity_bytes", "used_bytes", "blocks", "hits", "evictions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    medium: Medium
    capacity_bytes: int
    used_bytes: int
    blocks: int
    hits: int
    evictions: int
    def __init__(self, name: _Optional[str] = ..., medium: _Optional[_Union[Medium, str]] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., blocks: _Optional[int] = ..., hits: _Optional[int] = ..., evictions: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("tiers", "blocks", "namespaces", "lookups", "lookup_hit_blocks", "lookup_miss_blocks", "puts", "gets", "bytes_in", "bytes_out", "pending_moves", "version", "sessions", "events_published", "transfers_failed", "transfers_dropped", "events_dropped", "corrupt_reads", "orphans_dropped", "demotions_failed", "startup_skipped", "quarantined_slots", "policy", "quotas", "retention", "retained_granted", "retained_refused", "retained_returned", "retained_evicted", "loop_lag")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_MISS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    GETS_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    PENDING_MOVES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FAILED_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_READS_FIELD_NUMBER: _ClassVar[int]
    ORPHANS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    DEMOTIONS_FAILED_FIELD_NUMBER: _ClassVar[int]
    STARTUP_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    RETAINED_GRANTED_FIELD_NUMBER: _ClassVar[int]
    RETAINED_REFUSED_FIELD_NUMBER: _ClassVar[int]
    RETAINED_RETURNED_FIELD_NUMBER: _ClassVar[int]
    RETAINED_EVICTED_FIELD_NUMBER: _ClassVar[int]
    LOOP_LAG_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    blocks: int
    namespaces: int
    lookups: int
    lookup_hit_blocks: int
    lookup_miss_blocks: int
    puts: int
    gets: int
    bytes_in: int
    bytes_out: int
    pending_moves: int
    version: str
    sessions: int
    events_published: int
    transfers_failed: int
    transfers_dropped: int
    events_dropped: int
    corrupt_reads: int
    orphans_dropped: int
    demotions_failed: int
    startup_skipped: int
    quarantined_slots: int
    policy: str
    quotas: _containers.RepeatedCompositeFieldContainer[QuotaStats]
    retention: _containers.RepeatedCompositeFieldContainer[RetentionStats]
    retained_granted: int
    retained_refused: int
    retained_returned: int
    retained_evicted: int
    loop_lag: LoopLag
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., blocks: _Optional[int] = ..., namespaces: _Optional[int] = ..., lookups: _Optional[int] = ..., lookup_hit_blocks: _Optional[int] = ..., lookup_miss_blocks: _Optional[int] = ..., puts: _Optional[int] = ..., gets: _Optional[int] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., pending_moves: _Optional[int] = ..., version: _Optional[str] = ..., sessions: _Optional[int] = ..., events_published: _Optional[int] = ..., transfers_failed: _Optional[int] = ..., transfers_dropped: _Optional[int] = ..., events_dropped: _Optional[int] = ..., corrupt_reads: _Optional[int] = ..., orphans_dropped: _Optional[int] = ..., demotions_failed: _Optional[int] = ..., startup_skipped: _Optional[int] = ..., quarantined_slots: _Optional[int] = ..., policy: _Optional[str] = ..., quotas: _Optional[_Iterable[_Union[QuotaStats, _Mapping]]] = ..., retention: _Optional[_Iterable[_Union[RetentionStats, _Mapping]]] = ..., retained_granted: _Optional[int] = ..., retained_refused: _Optional[int] = ..., retained_returned: _Optional[int] = ..., retained_evicted: _Optional[int] = ..., loop_lag: _Optional[_Union[LoopLag, _Mapping]] = ...) -> None: ...

class RetentionStats(_message.Message):
    __slots__ = ("tenant", "tier", "retained_bytes", "limit_bytes")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    RETAINED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    tier: str
    retained_bytes: int
    limit_bytes: int
    def __init__(self, tenant: _Optional[str] = ..., tier: _Optional[str] = ..., retained_bytes: _Optional[int] = ..., limit_bytes: _Optional[int] = ...) -> None: ...

class QuotaStats(_message.Message):
    __slots__ = ("namespace_prefix", "tier", "limit_bytes", "used_bytes", "evictions", "refused")
    NAMESPACE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    namespace_prefix: str
    tier: str
    limit_bytes: int
    used_bytes: int
    evictions: int
    refused: int
    def __init__(self, namespace_prefix: _Optional[str] = ..., tier: _Optional[str] = ..., limit_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., evictions: _Optional[int] = ..., refused: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("start_seq",)
    START_SEQ_FIELD_NUMBER: _ClassVar[int]
    start_seq: int
    def __init__(self, start_seq: _Optional[int] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("seq", "ts", "payload")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ts: float
    payload: bytes
    def __init__(self, seq: _Optional[int] = ..., ts: _Optional[float] = ..., payload: _Optional[bytes] = ...) -> None: ...

class Distribution(_message.Message):
    __slots__ = ("count", "mean", "p50", "p90", "p99", "min", "max")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    P50_FIELD_NUMBER: _ClassVar[int]
    P90_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float
    def __init__(self, count: _Optional[int] = ..., mean: _Optional[float] = ..., p50: _Optional[float] = ..., p90: _Optional[float] = ..., p99: _Optional[float] = ..., min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class ProfileRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProfileReuse(_message.Message):
    __slots__ = ("block_lookups", "hit_blocks", "unbounded_hit_rate")
    BLOCK_LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    UNBOUNDED_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    block_lookups: int
    hit_blocks: int
    unbounded_hit_rate: float
    def __init__(self, block_lookups: _Optional[int] = ..., hit_blocks: _Optional[int] = ..., unbounded_hit_rate: _Optional[float] = ...) -> None: ...

class ProfileSessions(_message.Message):
    __slots__ = ("sessions", "calls_per_session", "read_back_tokens", "new_tokens", "gap_seconds", "duration_seconds")
    class GapSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Distribution
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Distribution, _Mapping]] = ...) -> None: ...
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CALLS_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    READ_BACK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GAP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    sessions: int
    calls_per_session: Distribution
    read_back_tokens: Distribution
    new_tokens: Distribution
    gap_seconds: _containers.MessageMap[str, Distribution]
    duration_seconds: Distribution
    def __init__(self, sessions: _Optional[int] = ..., calls_per_session: _Optional[_Union[Distribution, _Mapping]] = ..., read_back_tokens: _Optional[_Union[Distribution, _Mapping]] = ..., new_tokens: _Optional[_Union[Distribution, _Mapping]] = ..., gap_seconds: _Optional[_Mapping[str, Distribution]] = ..., duration_seconds: _Optional[_Union[Distribution, _Mapping]] = ...) -> None: ...

class ProfileResponse(_message.Message):
    __slots__ = ("window_seconds", "requests", "block_tokens", "kv_bytes_per_token", "input_tokens", "output_tokens", "ratio", "context_tokens", "quadrants", "workloads", "span_seconds", "requests_per_minute", "per_minute", "bin_seconds", "bins", "peak", "trough", "peak_to_trough", "interarrival_cv", "reuse", "sessions", "notes", "retained_blocks", "retained_came_back")
    class QuadrantsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class WorkloadsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUADRANTS_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    SPAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    BIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BINS_FIELD_NUMBER: _ClassVar[int]
    PEAK_FIELD_NUMBER: _ClassVar[int]
    TROUGH_FIELD_NUMBER: _ClassVar[int]
    PEAK_TO_TROUGH_FIELD_NUMBER: _ClassVar[int]
    INTERARRIVAL_CV_FIELD_NUMBER: _ClassVar[int]
    REUSE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    RETAINED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RETAINED_CAME_BACK_FIELD_NUMBER: _ClassVar[int]
    window_seconds: float
    requests: int
    block_tokens: int
    kv_bytes_per_token: float
    input_tokens: Distribution
    output_tokens: Distribution
    ratio: Distribution
    context_tokens: Distribution
    quadrants: _containers.ScalarMap[str, int]
    workloads: _containers.ScalarMap[str, int]
    span_seconds: float
    requests_per_minute: float
    per_minute: Distribution
    bin_seconds: float
    bins: int
    peak: int
    trough: int
    peak_to_trough: float
    interarrival_cv: float
    reuse: ProfileReuse
    sessions: ProfileSessions
    notes: _containers.RepeatedScalarFieldContainer[str]
    retained_blocks: int
    retained_came_back: int
    def __init__(self, window_seconds: _Optional[float] = ..., requests: _Optional[int] = ..., block_tokens: _Optional[int] = ..., kv_bytes_per_token: _Optional[float] = ..., input_tokens: _Optional[_Union[Distribution, _Mapping]] = ..., output_tokens: _Optional[_Union[Distribution, _Mapping]] = ..., ratio: _Optional[_Union[Distribution, _Mapping]] = ..., context_tokens: _Optional[_Union[Distribution, _Mapping]] = ..., quadrants: _Optional[_Mapping[str, int]] = ..., workloads: _Optional[_Mapping[str, int]] = ..., span_seconds: _Optional[float] = ..., requests_per_minute: _Optional[float] = ..., per_minute: _Optional[_Union[Distribution, _Mapping]] = ..., bin_seconds: _Optional[float] = ..., bins: _Optional[int] = ..., peak: _Optional[int] = ..., trough: _Optional[int] = ..., peak_to_trough: _Optional[float] = ..., interarrival_cv: _Optional[float] = ..., reuse: _Optional[_Union[ProfileReuse, _Mapping]] = ..., sessions: _Optional[_Union[ProfileSessions, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ..., retained_blocks: _Optional[int] = ..., retained_came_back: _Optional[int] = ...) -> None: ...
