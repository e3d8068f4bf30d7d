"""Sessions and turn-end hints, from ``kv_transfer_params`` or the prefix chain.

A client says who a request belongs to and what comes after it::

    SamplingParams(extra_args={"kv_transfer_params": {
        "session_id": "conv-42", "workload": "agent",
        "after": "tool_call", "tool": "search", "expected_gap_ms": 800}})

``cache_ttl_s`` retains the request's blocks in the sidecar for that many seconds
(like ``cache_control``: a system prompt and tool schemas for an hour, a
conversation for five minutes): soft protection, within the tenant's retention
quota (see the README's Retention section).

``after`` is what the session waits for once this turn's answer is out:
``"user"`` (a person replies; the default), ``"tool_call"`` (a tool runs and
its result comes back as the next turn), ``"end"`` (the session is over).
Hint event names (``turn_end``, ``tool_call``, ``session_end``, ...) are taken
as they are.

Without a ``session_id`` the session is inferred from the prefix chain: a new
turn of a conversation resends the previous turn's tokens, so its block hashes
extend the hashes of that turn. The tracker remembers the last full block of
each finished turn; a request whose chain contains one continues that session,
otherwise it starts one named after its first block. Pure code, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.errors import InvalidArgument
from kvstore.types import Workload

__all__ = ["AFTER_EVENTS", "SessionTracker", "TurnInfo"]

#: ``after`` values and the hint event each sends.
AFTER_EVENTS = {
    "user": "turn_end",
    "tool_call": "tool_call",
    "tool": "tool_call",
    "end": "session_end",
}
_EVENTS = {"turn_end", "tool_call", "tool_result", "user", "session_start", "session_end"}


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """Who a request belongs to and what happens after it."""

    session_id: str
    workload: str
    event: str
    tool: str | None = None
    expected_gap_ms: float | None = None
    inferred: bool = False
    #: Seconds to retain the request's blocks for (``cache_ttl_s``; None: not asked).
    cache_ttl_s: float | None = None


def _str_param(params: Mapping[str, Any], key: str) -> str | None:
    value = params.get(key)
    return value if isinstance(value, str) and value else None


def _gap_param(params: Mapping[str, Any], key: str = "expected_gap_ms") -> float | None:
    value = params.get(key)
    if (isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
            and value == value and value != float("inf")):
        return float(value)
    return None


class SessionTracker:
    """Maps requests to sessions; remembers turn tails to infer the next turn."""

    def __init__(self, default_workload: str = Workload.UNKNOWN.value, capacity: int = 65536):
        self._default_workload = Workload.parse(default_workload).value
        self._capacity = capacity
        # last full block hash of a finished turn -> (session id, workload)
        self._tails: OrderedDict[bytes, tuple[str, str]] = OrderedDict()

    def classify(self, params: Mapping[str, Any] | None, block_hashes: Sequence[bytes]) -> TurnInfo:
        params = params if isinstance(params, Mapping) else {}
        session_id = _str_param(params, "session_id")
        workload = _str_param(params, "workload")
        inferred = False
        if session_id is None or workload is None:
            found = self._continued(block_hashes)
            if session_id is None:
                inferred = True
                if found is not None:
                    session_id = found[0]
                elif block_hashes:
                    session_id = "auto-" + bytes(block_hashes[0]).hex()[:16]
                else:
                    session_id = "auto-short"
            if workload is None and found is not None and found[0] == session_id:
                workload = found[1]
        try:
            workload = Workload.parse(workload).value if workload else self._default_workload
        except InvalidArgument:  # an unknown class from a client: not fatal
            workload = self._default_workload
        after = _str_param(params, "after") or "user"
        event = AFTER_EVENTS.get(after) or (after if after in _EVENTS else "turn_end")
        return TurnInfo(
            session_id=session_id,
            workload=workload,
            event=event,
            tool=_str_param(params, "tool"),
            expected_gap_ms=_gap_param(params),
            inferred=inferred,
            cache_ttl_s=_gap_param(params, "cache_ttl_s"),
        )

    def _continued(self, block_hashes: Sequence[bytes]) -> tuple[str, str] | None:
        for block_hash in reversed(block_hashes):
            found = self._tails.get(bytes(block_hash))
            if found is not None:
                self._tails.move_to_end(bytes(block_hash))
                return found
        return None

    def turn_finished(self, turn: TurnInfo, block_hashes: Sequence[bytes]) -> None:
        """Remember the turn's tail so the next turn of the session is recognised."""
        if not block_hashes:
            return
        if turn.event == "session_end":
            self._tails.pop(bytes(block_hashes[-1]), None)
            return
        self._tails[bytes(block_hashes[-1])] = (turn.session_id, turn.workload)
        self._tails.move_to_end(bytes(block_hashes[-1]))
        while len(self._tails) > self._capacity:
            self._tails.popitem(last=False)
