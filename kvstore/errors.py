"""The one exception tree of kvstore.

Every error the service raises on purpose is a :class:`KVStoreError`; each
branch maps to exactly one gRPC status code, so a client always learns *what*
was wrong and whether retrying can help::

    KVStoreError
    ├── InvalidArgument          INVALID_ARGUMENT    the request itself is wrong
    │   ├── InvalidBlock               bad hash length, empty payload, bad tokens
    │   ├── PayloadTooLarge            payload over the configured per-block limit
    │   ├── BadDescriptor              shared-memory descriptor outside its segment
    │   └── ConfigError                a config field has an invalid value
    ├── NotFound                 NOT_FOUND           nothing stored under that name
    │   ├── NamespaceNotFound
    │   └── BlockNotFound
    ├── ResourceExhausted        RESOURCE_EXHAUSTED  no room, now or ever
    │   ├── BlockTooLargeForTier       block bigger than a whole tier
    │   └── TierFull                   nothing evictable frees enough room
    │       └── QuotaExceeded                the tenant is at its quota in the tier
    ├── PermissionDenied         PERMISSION_DENIED   not yours (another client's slot or lease,
    │                                                 a namespace or right outside the grant)
    ├── Unauthenticated          UNAUTHENTICATED     no credential, or one the server does not know
    ├── FailedPrecondition       FAILED_PRECONDITION state does not allow it
    │   ├── UnknownReservation         commit of a slot never reserved (or expired)
    │   └── LeaseExpired               read lease no longer valid; data discarded
    ├── Unavailable              UNAVAILABLE         a dependency is down; retry later
    │   └── TierUnavailable            Redis unreachable, disk failing
    └── DataCorruption           DATA_LOSS           checksum mismatch on read

Driver errors (OSError, redis errors, grpc errors) are translated at the
boundary with ``raise Ours(msg) from exc``; nothing known leaves as INTERNAL.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BadDescriptor",
    "BlockNotFound",
    "BlockTooLargeForTier",
    "ConfigError",
    "DataCorruption",
    "FailedPrecondition",
    "InvalidArgument",
    "InvalidBlock",
    "KVStoreError",
    "LeaseExpired",
    "NamespaceNotFound",
    "NotFound",
    "PermissionDenied",
    "QuotaExceeded",
    "PayloadTooLarge",
    "ResourceExhausted",
    "TierFull",
    "TierUnavailable",
    "Unauthenticated",
    "Unavailable",
    "UnknownReservation",
    "error_for_status",
]


class KVStoreError(Exception):
    """Base of every error kvstore raises on purpose."""

    #: Name of the grpc.StatusCode member this error maps to.
    status: ClassVar[str] = "UNKNOWN"


class InvalidArgument(KVStoreError):
    status = "INVALID_ARGUMENT"


class InvalidBlock(InvalidArgument):
    pass


class PayloadTooLarge(InvalidArgument):
    pass


class BadDescriptor(InvalidArgument):
    pass


class ConfigError(InvalidArgument):
    pass


class NotFound(KVStoreError):
    status = "NOT_FOUND"


class NamespaceNotFound(NotFound):
    pass


class BlockNotFound(NotFound):
    pass


class ResourceExhausted(KVStoreError):
    status = "RESOURCE_EXHAUSTED"


class BlockTooLargeForTier(ResourceExhausted):
    pass


class TierFull(ResourceExhausted):
    pass


class QuotaExceeded(TierFull):
    """The namespace's tenant is at its quota in the tier and none of its own blocks
    there can make room (``[[quotas]]``)."""


class PermissionDenied(KVStoreError):
    status = "PERMISSION_DENIED"


class Unauthenticated(KVStoreError):
    status = "UNAUTHENTICATED"


class FailedPrecondition(KVStoreError):
    status = "FAILED_PRECONDITION"


class UnknownReservation(FailedPrecondition):
    pass


class LeaseExpired(FailedPrecondition):
    pass


class Unavailable(KVStoreError):
    status = "UNAVAILABLE"


class TierUnavailable(Unavailable):
    pass


class DataCorruption(KVStoreError):
    status = "DATA_LOSS"


_BY_STATUS: dict[str, type[KVStoreError]] = {
    cls.status: cls
    for cls in (
        InvalidArgument,
        NotFound,
        ResourceExhausted,
        PermissionDenied,
        Unauthenticated,
        FailedPrecondition,
        Unavailable,
        DataCorruption,
    )
}


def error_for_status(status_name: str, message: str) -> KVStoreError:
    """Rebuild the client-side exception for a gRPC status name (e.g. ``"NOT_FOUND"``)."""
    return _BY_STATUS.get(status_name, KVStoreError)(message)
