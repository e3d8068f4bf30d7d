"""Shared memory or gRPC: the client's decision after asking the server for its segments.

A client on the server's host maps the server's DRAM segments and moves bytes
through them; anywhere else it streams over gRPC. A client on the same host that
cannot map them (the segment is another user's and ``0600``, the containers do not
share ``/dev/shm``, the server has no DRAM tier or refuses this tenant the plane)
still works over gRPC, several times slower: it says why at WARNING and counts it
in ``kvstore_client_fallbacks_total{reason}`` of the process's default Prometheus
registry (the one vLLM serves on its ``/metrics``).

Reasons: ``permission`` (the segment is not this user's to map), ``missing`` (no
such segment in this process's ``/dev/shm``), ``no_segments`` (the server has no
DRAM tier), ``refused`` (the server refused the call: a tenant with
``shared_memory = false``), ``unavailable`` (the server did not answer the
probe), ``error`` (anything else).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from kvstore._host import host_id
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.client.segments import SegmentCache
from kvstore.errors import FailedPrecondition, KVStoreError, PermissionDenied, Unavailable

__all__ = ["FALLBACK_REASONS", "fallback_counter", "probe_failed", "use_segments"]

log = logging.getLogger(__name__)

FALLBACK_REASONS = ("permission", "missing", "no_segments", "refused", "unavailable", "error")
_COUNTER: Any = None
_COUNTER_LOCK = threading.Lock()


def fallback_counter() -> Any:
    """``kvstore_client_fallbacks_total{reason}`` in the default registry (made once)."""
    global _COUNTER
    with _COUNTER_LOCK:
        if _COUNTER is None:
            from prometheus_client import Counter

            _COUNTER = Counter(
                "kvstore_client_fallbacks",
                "kvstore clients on the server's host that use gRPC instead of its shared "
                "memory, by reason", ["reason"])
            for reason in FALLBACK_REASONS:
                _COUNTER.labels(reason=reason)
    return _COUNTER


def _identity() -> str:
    return f"uid {os.getuid()}, gid {os.getgid()}, groups {sorted(os.getgroups())}"


def _explain(reason: str, exc: BaseException | None) -> str:
    hints = {
        "permission": f"this process ({_identity()}) may not map it; run the client as the "
                      "server's user, or in the segment's group with the server's "
                      "dram.segment_mode = \"0660\" (and dram.segment_group)",
        "missing": "this process does not see the server's /dev/shm; share it (Kubernetes: "
                   "one emptyDir at /dev/shm in both containers; compose: ipc: "
                   "\"service:<sidecar>\")",
        "no_segments": "the server has no DRAM tier (dram.enabled = false)",
        "refused": "the server refused the shared-memory plane to this client",
        "unavailable": "the server did not answer the probe",
        "error": "",
    }
    detail = f"{exc}" if exc is not None else ""
    return "; ".join(p for p in (detail, hints[reason]) if p)


def _fall_back(address: str, reason: str, exc: BaseException | None) -> bool:
    fallback_counter().labels(reason=reason).inc()
    log.warning("kvstore: shared memory of the server at %s unusable (%s), using gRPC "
                "streaming (several times slower): %s", address, reason, _explain(reason, exc))
    return False


def probe_failed(address: str, exc: KVStoreError | OSError, required: bool | None) -> bool:
    """The Segments call failed: re-raise when shared memory is required, else fall back."""
    if required:
        raise exc
    if isinstance(exc, FailedPrecondition):  # the server has no shared-memory plane
        reason = "no_segments"
    elif isinstance(exc, PermissionDenied):
        reason = "refused"
    elif isinstance(exc, Unavailable):
        reason = "unavailable"
    else:
        reason = "error"
    return _fall_back(address, reason, exc)


def use_segments(address: str, resp: pb.SegmentsResponse, segments: SegmentCache,
                 required: bool | None) -> bool:
    """Map the server's segments when it is on this host; True when all of them mapped.

    ``required``: raise instead of falling back (a server elsewhere, a segment that
    does not map)."""
    if resp.host_id != host_id():
        if required:
            raise KVStoreError(f"server at {address} is not on this host: no shared memory")
        log.info("kvstore: the server at %s is on another host, using gRPC streaming", address)
        return False
    if not resp.segments:
        if required:
            raise KVStoreError(f"server at {address} has no shared-memory segments "
                               "(dram.enabled = false)")
        return _fall_back(address, "no_segments", None)
    try:
        for s in resp.segments:
            segments.buf(s.name)
    except OSError as exc:
        if required:
            raise
        segments.close()
        reason = ("permission" if isinstance(exc, PermissionError)
                  else "missing" if isinstance(exc, FileNotFoundError) else "error")
        return _fall_back(address, reason, exc)
    return True
