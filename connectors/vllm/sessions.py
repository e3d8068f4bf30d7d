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

What the client says at submission is a guess: whether the model ends its turn
with a tool call is only known when generation stops. :func:`finished_turn`
corrects the turn's event from what the engine saw (the request's stop and its
output tokens against the configured :class:`ToolCallMarkers`); the lookup made
at submission keeps the client's claim, the hint sent at the finish carries the
correction. A turn the client did not describe (``TurnInfo.described``) claims
nothing: its lookup carries no ``then``, and its end sends a hint only if the
engine saw how it ended.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvstore.errors import InvalidArgument
from kvstore.turns import AFTER_EVENTS, described, lookup_then
from kvstore.types import Workload

__all__ = ["AFTER_EVENTS", "SessionTracker", "ToolCallMarkers", "TurnInfo", "finished_turn"]

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
    #: Whether ``kv_transfer_params`` said ``after`` (False: the ``user`` default).
    claimed: bool = False

    @property
    def described(self) -> bool:
        """Whether the client said anything of what follows this turn (``after`` or
        ``expected_gap_ms``): the one rule of :mod:`kvstore.turns`. An undescribed
        turn's lookup carries no ``then`` and, unless the engine saw how it ended (a
        tool-call marker, a stop without one), its end sends no hint."""
        return described(self.claimed, self.expected_gap_ms)

    @property
    def then(self) -> str:
        """The ``then`` this turn's lookup carries (``""``: not described)."""
        return lookup_then(self.event, self.claimed, self.expected_gap_ms)


@dataclass(frozen=True, slots=True)
class ToolCallMarkers:
    """What a tool call looks like in a model's output, as token ids.

    ``stop_token_ids``: a generation that stops on one of these ends with a tool
    call (Llama 3's ``<|eom_id|>``). ``sequences``: an output that contains one of
    these token sequences holds a complete tool call (the ids of ``</tool_call>``).
    """

    stop_token_ids: frozenset[int] = frozenset()
    sequences: tuple[tuple[int, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.stop_token_ids or self.sequences)

    def found_in(self, stopped: bool, stop_reason: object,
                 output_token_ids: Sequence[int]) -> str | None:
        """Which marker the finished generation shows (``stop_token`` or
        ``token_sequence``), or None."""
        if stopped and self.stop_token_ids:
            last = output_token_ids[-1] if output_token_ids else None
            if stop_reason in self.stop_token_ids or last in self.stop_token_ids:
                return "stop_token"
        for seq in self.sequences:
            if _contains(output_token_ids, seq):
                return "token_sequence"
        return None


def _contains(tokens: Sequence[int], seq: tuple[int, ...]) -> bool:
    n, m = len(tokens), len(seq)
    if m == 0 or m > n:
        return False
    first = seq[0]
    return any(tokens[i] == first and tuple(tokens[i : i + m]) == seq
               for i in range(n - m + 1))


def finished_turn(turn: TurnInfo, markers: ToolCallMarkers, *, stopped: bool,
                  stop_reason: object, output_token_ids: Sequence[int]) -> tuple[TurnInfo, str]:
    """The turn's end as the engine saw it, and where that came from.

    A tool-call marker in the output makes the event ``tool_call`` (``stop_token`` /
    ``token_sequence``). With markers configured, a generation that stopped by
    itself (end of sequence, a stop token or string) without one ended its turn
    without a tool call: a claimed ``tool_call`` becomes ``turn_end`` (``stop``).
    Otherwise (no markers, a length cap, an abort) the client's ``after`` holds
    (``params``), else the ``user`` default (``default``). A ``session_end`` the
    client claimed is kept: the engine cannot see that a session is over.
    A changed event drops the client's ``tool`` and ``expected_gap_ms``, which
    described the claimed one.
    """
    claimed = "params" if turn.claimed else "default"
    if not markers or turn.event == "session_end":
        return turn, claimed
    found = markers.found_in(stopped, stop_reason, output_token_ids)
    if found is not None:
        if turn.event == "tool_call":
            return turn, found
        return replace(turn, event="tool_call", tool=None, expected_gap_ms=None), found
    if stopped and turn.event == "tool_call":
        return replace(turn, event="turn_end", tool=None, expected_gap_ms=None), "stop"
    return turn, claimed


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
        claimed = _str_param(params, "after")
        after = claimed or "user"
        event = AFTER_EVENTS.get(after) or (after if after in _EVENTS else "turn_end")
        return TurnInfo(
            session_id=session_id,
            workload=workload,
            event=event,
            tool=_str_param(params, "tool"),
            expected_gap_ms=_gap_param(params),
            inferred=inferred,
            cache_ttl_s=_gap_param(params, "cache_ttl_s"),
            claimed=claimed is not None,
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
