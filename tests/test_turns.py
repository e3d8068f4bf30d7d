"""The undescribed-turn rule (``kvstore.turns``), written once: the vLLM connector and
the served replay send the same ``then`` for the same client description."""

from __future__ import annotations

import pytest
from kvstore.connectors.vllm.sessions import SessionTracker

from kvstore.replay.served import client_then
from kvstore.replay.trace import After, Request
from kvstore.turns import described, lookup_then


def test_the_rule() -> None:
    assert not described(False) and not described(False, None)
    assert described(True) and described(False, 0.0) and described(False, 5000.0)
    assert lookup_then("turn_end", False) == ""
    assert lookup_then("turn_end", False, 2000.0) == "turn_end"
    assert lookup_then("tool_call", True) == "tool_call"


@pytest.mark.parametrize(("after", "then"), [
    (None, ""),                   # nothing said: the "user" default is no information
    ("user", "turn_end"),
    ("tool_call", "tool_call"),
    ("end", "session_end"),
])
def test_connector_and_replay_send_the_same_then(after: str | None, then: str) -> None:
    params = {"session_id": "s"}  # the request's kv_transfer_params
    if after is not None:
        params |= {"after": after, "tool": "bash"}
    turn = SessionTracker().classify(params, [b"\x01" * 8])
    req = Request(0, 1024, 8, (1, 2), session_id="s",
                  after=None if after is None else After(after, "bash"))
    replay_then, tool = client_then(req, trust_end=True)
    assert turn.then == replay_then == then
    assert turn.described is bool(then)
    assert tool == ("bash" if then else "")
