"""A multi-turn agent conversation against vLLM with the kvstore connector.

Start the sidecar and vLLM first (see ``examples/vllm_connector_serve.sh`` or
``docs/vllm-connector.md``), then::

    python examples/vllm_agent_session.py --url http://127.0.0.1:8000 --model my-model

Each call resends the whole conversation (as chat clients and agents do) and
tells the connector, through ``kv_transfer_params``, which session it belongs
to and what happens after the answer: a tool call (a short gap: the engine
may keep its blocks), the user (minutes: the sidecar's policy decides where
the blocks wait), the end (they may go). The response's ``kv_transfer_params``
says how much of the prompt came back from the sidecar. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from typing import Any


def chat(url: str, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Any:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": 64,
        "temperature": 0.0,
        "kv_transfer_params": params,
    }
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.load(resp)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", required=True)
    ap.add_argument("--session", default=f"agent-{int(time.time())}")
    args = ap.parse_args()

    messages = [
        {"role": "system", "content": "You are a coding agent. Tools: search(query), run(cmd)."},
        {"role": "user", "content": "Find why the nightly build fails and fix it."},
    ]
    steps: list[dict[str, Any]] = [
        # The model asks for a tool; its result is back in ~800 ms.
        {"after": "tool_call", "tool": "search", "expected_gap_ms": 800},
        {"after": "tool_call", "tool": "run", "expected_gap_ms": 1500},
        # The answer goes to a person: minutes.
        {"after": "user"},
        {"after": "end"},
    ]
    tool_results = [
        "search: build.log line 812: undefined symbol foo_v2",
        "run: make -j8 ... ok after renaming foo_v2 to foo",
        "Thanks! Can you also add a regression test?",
    ]
    for i, step in enumerate(steps):
        params = {"session_id": args.session, "workload": "agent", **step}
        started = time.perf_counter()
        out = chat(args.url, args.model, messages, params)
        elapsed = time.perf_counter() - started
        answer = out["choices"][0]["message"]["content"]
        info = (out.get("kv_transfer_params") or {}).get("kvstore", {})
        # vLLM's own cache serves what it still holds; the sidecar fills in
        # the rest (after eviction, a restart, or on another replica).
        print(
            f"turn {i}: {elapsed:.2f} s, {info.get('sidecar_hit_tokens', 0)} prompt tokens in "
            f"the sidecar, {info.get('loaded_tokens', 0)} loaded from it, "
            f"hint {info.get('event')}, held {info.get('held_ms', 0)} ms"
        )
        messages.append({"role": "assistant", "content": answer})
        if i < len(tool_results):
            who = "tool result" if step["after"] == "tool_call" else "user"
            messages.append({"role": "user", "content": f"[{who}] {tool_results[i]}"})


if __name__ == "__main__":
    main()
