"""What a client says of a turn's end, read one way by every front end.

The vLLM connector (``connectors/vllm/sessions.py``, ``scheduler.py``) and the
trace replay (``kvstore/replay/served.py``) both turn a client's ``after`` (what the
session waits on once this request is answered: ``user``, ``tool_call``, ``end``)
into the hint event its lookup carries as ``then`` and its end sends. A turn the
client did not describe (no ``after``, no expected gap) claims nothing: its
``user`` is a default, not information, so its lookup carries no ``then`` and its
end sends no hint (the connector still sends one where the engine saw how the
turn ended), and the sidecar's policy learns such sessions' returns as their own
class instead of filing them with the waits a client announced.
"""

from __future__ import annotations

__all__ = ["AFTER_EVENTS", "described", "lookup_then"]

#: ``after`` values and the hint event each sends.
AFTER_EVENTS = {
    "user": "turn_end",
    "tool_call": "tool_call",
    "tool": "tool_call",
    "end": "session_end",
}


def described(claimed: bool, expected_gap_ms: float | None = None) -> bool:
    """Whether the client said anything of what follows the turn: an ``after``
    (``claimed``) or the gap until the session's next request."""
    return claimed or expected_gap_ms is not None


def lookup_then(event: str, claimed: bool, expected_gap_ms: float | None = None) -> str:
    """The ``then`` a request's lookup carries: the turn's hint ``event`` where the
    client described the turn (:func:`described`), else ``""``."""
    return event if described(claimed, expected_gap_ms) else ""
