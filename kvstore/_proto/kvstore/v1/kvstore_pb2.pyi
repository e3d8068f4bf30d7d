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
    __slots__ = ("namespace", "block_hashes", "session_id", "workload")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    session_id: str
    workload: str
    def __init__(self, namespace: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., session_id: _Optional[str] = ..., workload: _Optional[str] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("num_hit", "media")
    NUM_HIT_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    num_hit: int
    media: _containers.RepeatedScalarFieldContainer[Medium]
    def __init__(self, num_hit: _Optional[int] = ..., media: _Optional[_Iterable[_Union[Medium, str]]] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("namespace", "blocks", "session_id", "workload")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    session_id: str
    workload: str
    def __init__(self, namespace: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., session_id: _Optional[str] = ..., workload: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("segments", "host_id")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    host_id: str
    def __init__(self, segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., host_id: _Optional[str] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("namespace", "sizes", "block_hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    sizes: _containers.RepeatedScalarFieldContainer[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., sizes: _Optional[_Iterable[int]] = ..., block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("slots", "lease_seconds")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[SlotDescriptor]
    lease_seconds: float
    def __init__(self, slots: _Optional[_Iterable[_Union[SlotDescriptor, _Mapping]]] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("namespace", "slots", "headers", "session_id", "workload")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    slots: _containers.RepeatedCompositeFieldContainer[SlotDescriptor]
    headers: _containers.RepeatedCompositeFieldContainer[BlockHeader]
    session_id: str
    workload: str
    def __init__(self, namespace: _Optional[str] = ..., slots: _Optional[_Iterable[_Union[SlotDescriptor, _Mapping]]] = ..., headers: _Optional[_Iterable[_Union[BlockHeader, _Mapping]]] = ..., session_id: _Optional[str] = ..., workload: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("session_id", "event", "workload", "tool", "expected_gap_ms", "namespace")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_GAP_MS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    event: str
    workload: str
    tool: str
    expected_gap_ms: float
    namespace: str
    def __init__(self, session_id: _Optional[str] = ..., event: _Optional[str] = ..., workload: _Optional[str] = ..., tool: _Optional[str] = ..., expected_gap_ms: _Optional[float] = ..., namespace: _Optional[str] = ...) -> None: ...

class HintResponse(_message.Message):
    __slots__ = ("moves",)
    MOVES_FIELD_NUMBER: _ClassVar[int]
    moves: int
    def __init__(self, moves: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

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
    __slots__ = ("tiers", "blocks", "namespaces", "lookups", "lookup_hit_blocks", "lookup_miss_blocks", "puts", "gets", "bytes_in", "bytes_out", "pending_moves", "version", "sessions", "events_published", "transfers_failed", "transfers_dropped", "events_dropped", "corrupt_reads", "orphans_dropped", "demotions_failed", "startup_skipped", "quarantined_slots")
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
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., blocks: _Optional[int] = ..., namespaces: _Optional[int] = ..., lookups: _Optional[int] = ..., lookup_hit_blocks: _Optional[int] = ..., lookup_miss_blocks: _Optional[int] = ..., puts: _Optional[int] = ..., gets: _Optional[int] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., pending_moves: _Optional[int] = ..., version: _Optional[str] = ..., sessions: _Optional[int] = ..., events_published: _Optional[int] = ..., transfers_failed: _Optional[int] = ..., transfers_dropped: _Optional[int] = ..., events_dropped: _Optional[int] = ..., corrupt_reads: _Optional[int] = ..., orphans_dropped: _Optional[int] = ..., demotions_failed: _Optional[int] = ..., startup_skipped: _Optional[int] = ..., quarantined_slots: _Optional[int] = ...) -> None: ...

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
