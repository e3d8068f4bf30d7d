"""Decoding streams' inter-token gaps while another request arrives, in a real engine.

Drives ``llm.llm_engine`` step by step (the engine core runs in its own process and
keeps stepping; ``step()`` collects what it produced), timestamps every new token of
every request, and returns the gaps between consecutive tokens of each stream::

    stall = decode_while(llm, streams, prompt, max_tokens=8)
    stall.gaps_s  # every stream's inter-token gaps while ``prompt`` was served

Runs under the vLLM venv.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Stall", "decode_while", "percentile"]


@dataclass
class Stall:
    #: Inter-token gaps of the streams between the request's arrival and its end.
    gaps_s: list[float] = field(default_factory=list)
    #: Tokens the streams produced in that window.
    stream_tokens: int = 0
    #: The request: its tokens, kv_transfer_params["kvstore"], time to first token.
    tokens: list[int] = field(default_factory=list)
    kv: dict[str, Any] = field(default_factory=dict)
    ttft_s: float = 0.0
    num_cached_tokens: int = 0

    def summary(self) -> dict[str, float]:
        g = sorted(self.gaps_s)
        return {"p50_ms": percentile(g, 50) * 1e3, "p99_9_ms": percentile(g, 99.9) * 1e3,
                "max_ms": (g[-1] if g else 0.0) * 1e3, "gaps": len(g),
                "stream_tokens": self.stream_tokens, "ttft_s": self.ttft_s}


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def decode_while(llm: Any, streams: list[list[int]], prompt: list[int], *,
                 max_tokens: int = 8, warm_tokens: int = 4, stream_tokens: int = 1000,
                 params: dict[str, Any] | None = None, timeout_s: float = 120.0,
                 tag: str = "") -> Stall:
    """Start ``streams`` (greedy, ``stream_tokens`` each), once each decoded
    ``warm_tokens`` add ``prompt``; collect the streams' gaps until it finishes,
    then abort the streams."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    ids = [f"{tag}stream-{i}" for i in range(len(streams))]
    for rid, toks in zip(ids, streams, strict=True):
        engine.add_request(rid, {"prompt_token_ids": toks},
                           SamplingParams(max_tokens=stream_tokens, temperature=0.0,
                                          ignore_eos=True))
    counts = dict.fromkeys(ids, 0)
    last: dict[str, float] = {}
    stall = Stall()
    deadline = time.monotonic() + timeout_s
    target = f"{tag}target"
    added = None
    done = False
    while not done:
        if time.monotonic() > deadline:
            engine.abort_request([*ids, target])
            raise TimeoutError("the request did not finish in time")
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            n = len(out.outputs[0].token_ids)
            if out.request_id == target:
                if n and not stall.ttft_s and added is not None:
                    stall.ttft_s = now - added
                if out.finished:
                    stall.tokens = list(out.outputs[0].token_ids)
                    stall.kv = (out.kv_transfer_params or {}).get("kvstore") or {}
                    stall.num_cached_tokens = out.num_cached_tokens or 0
                    done = True
                continue
            if n > counts[out.request_id]:
                if added is not None and out.request_id in last:
                    stall.gaps_s.append(now - last[out.request_id])
                    stall.stream_tokens += n - counts[out.request_id]
                counts[out.request_id], last[out.request_id] = n, now
        if added is None and all(c >= warm_tokens for c in counts.values()):
            sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                extra_args={"kv_transfer_params": params} if params else None)
            engine.add_request(target, {"prompt_token_ids": prompt}, sp)
            added = time.perf_counter()
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return stall
