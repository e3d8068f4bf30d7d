"""The served topology: vLLM's own prefix cache in front, the sidecar behind.

Each request is played as a vLLM worker with the connector plays it:

1. It arrives at its trace time and waits (FIFO) until fewer than ``max_running``
   requests run. Room in the engine cache does not gate it: the traces carry more
   load than one engine of H blocks could run (the agent trace: 385,000 s of
   prefill in 155,000 s), so a request's blocks that find no free room are simply
   not cached (:class:`~kvstore.replay.engine_cache.EngineCache`), and each running
   request prefills at the stated rate (no sharing of the engine's throughput).
2. When it is scheduled, the engine finds its own cached prefix (``engine`` hits,
   no policy asked) and the connector looks the whole chain up in the sidecar,
   with the request's id, session, workload, prompt length and what the client
   says the turn ends with (``then`` / ``tool``, from the trace's ``after``). Blocks
   past the engine's own hit that the sidecar serves are loaded (priced at the
   tier's bandwidth); the rest is computed. As in vLLM, only full blocks have a
   hash (a partial last block is never looked up, saved or hit, but takes an
   engine slot while its request runs), and no hit reaches the prompt's last
   token, which the engine computes itself (``tests/vllm/bench_slice.py`` checks
   this model against a real engine).
3. When the prefill ends (load time + computed tokens / prefill tokens/s) the
   blocks the lookup said to store are saved; the output tokens then fill decode
   blocks (one per ``time_per_output_token`` x block tokens), saved when the
   request finishes, with the turn's hint and the engine's keep (the lookup's
   ``keep_s``, within the hold budget).
4. The sidecar is the server's :class:`~kvstore.engine.core.Engine` over in-memory
   tiers, its mover on the virtual clock (:mod:`kvstore.replay.timed_mover`).

What the client cannot know is not sent: the trace's ``end`` (a session's last
request) becomes a plain ``turn_end`` (a client sees the answer, not that the user
will never come back) unless ``trust_end`` says the trace's client knows it. A
request without ``after`` sends no ``then`` and no hint, as the connector does for a
turn its client did not describe.
Decode blocks are named by the session's next request where it shares this
request's full prompt blocks (the output is sent back as the next prompt), else by
fresh ids nothing asks for again; the name is the content's, not a decision.

The configuration and result types are :mod:`kvstore.replay.served_config`, the
per-request path (one engine and its sidecar, the phases above) is
:mod:`kvstore.replay.node`; this module is the event loop over one or more nodes
(the fleet replay runs one per worker, :mod:`kvstore.replay.fleet`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvstore.policies.cost import CostModel
from kvstore.replay.node import Run, ServedNode, build_sidecar, engine_node
from kvstore.replay.served_config import (
    DEFAULT_HOLD_MAX_S,
    DEFAULT_MAX_RUNNING,
    DEFAULT_TPOT_S,
    SIDECAR_TIERS,
    EngineModel,
    ServedConfig,
    ServedResult,
    check_sidecar_tiers,
    client_then,
    decode_block_ids,
    sidecar_alone,
)
from kvstore.replay.trace import Request

__all__ = ["DEFAULT_HOLD_MAX_S", "DEFAULT_MAX_RUNNING", "DEFAULT_TPOT_S", "SIDECAR_TIERS",
           "EngineModel", "ServedConfig", "ServedReplay", "ServedResult", "build_sidecar",
           "client_then", "decode_block_ids", "make_runs", "play", "replay_served",
           "sidecar_alone"]

#: Picks the node (an index) a request arriving at ``now`` goes to.
Pick = Callable[[Request, float], int]


def make_runs(requests: Sequence[Request]) -> list[Run]:
    """One :class:`Run` per request: its id ``r<i>``, arrival, whether it returns
    from a tool call (its session's previous request ended in one)."""
    last_after: dict[str, str] = {}
    runs: list[Run] = []
    for i, r in enumerate(requests):
        prev = last_after.get(r.session_id) if r.session_id is not None else None
        runs.append(Run(r, f"r{i}", r.timestamp_ms / 1000.0, prev == "tool_call", i))
        if r.session_id is not None:
            last_after[r.session_id] = r.after.kind if r.after else ""
    return runs


async def play(requests: Sequence[Request], nodes: Sequence[ServedNode],
               pick: Pick | None = None,
               progress: Callable[[int], None] | None = None) -> None:
    """Play ``requests`` (timestamp order) through ``nodes``: each request goes, at its
    arrival, to the node ``pick`` names (default the first) and runs its phases
    there at their times; on each node at most ``max_running`` requests run at once,
    the others wait (FIFO)."""
    runs = make_runs(requests)
    node_of = [0] * len(runs)
    # Events: (time, order, kind, request index); kinds: 0 prefill done, 1 finish,
    # 2 a hold's end.
    events: list[tuple[float, int, int, int]] = []
    order = 0
    nxt = 0
    waiting = 0  # requests waiting on all nodes
    now = 0.0
    push = heapq.heappush
    one = nodes[0] if len(nodes) == 1 else None

    async def advance(t: float) -> None:
        if one is not None:
            await one.advance(t)
        else:
            for nd in nodes:
                await nd.advance(t)

    async def finish(nd: ServedNode, i: int, t: float) -> None:
        nonlocal order
        held = await nd.finish(runs[i], t)
        nd.running -= 1
        if held > 0:
            push(events, (t + held, order, 2, i))
            order += 1

    async def try_start(nd: ServedNode, t: float) -> None:
        nonlocal order, waiting
        max_running = nd.model.max_running
        queue = nd.waiting
        while queue and nd.running < max_running:
            i = queue.popleft()
            waiting -= 1
            nd.running += 1
            run = runs[i]
            await nd.start(run, t)
            if run.prefill_end <= t:
                await nd.prefill_done(run)
                if run.finish <= t:
                    await finish(nd, i, t)
                    continue
                push(events, (run.finish, order, 1, i))
            else:
                push(events, (run.prefill_end, order, 0, i))
            order += 1

    n = len(runs)
    while nxt < n or events or waiting:
        t_arr = runs[nxt].arrival if nxt < n else math.inf
        if events and events[0][0] <= t_arr:
            t, _, kind, i = heapq.heappop(events)
            now = max(now, t)
            await advance(now)
            nd = nodes[node_of[i]]
            if kind == 0:
                await nd.prefill_done(runs[i])
                push(events, (runs[i].finish, order, 1, i))
                order += 1
            elif kind == 1:
                await finish(nd, i, now)
        elif nxt < n:
            now = max(now, t_arr)
            await advance(now)
            k = pick(runs[nxt].req, now) if pick is not None else 0
            node_of[nxt] = k
            nd = nodes[k]
            nd.waiting.append(nxt)
            waiting += 1
            nxt += 1
            if progress is not None and (nxt & 255) == 0:
                progress(256)
        else:  # waiting with nothing running: cannot happen (a lone request runs)
            raise RuntimeError("served replay: requests wait with none running")
        if one is not None:
            await try_start(one, now)
        else:
            for nd in nodes:
                if nd.waiting:
                    await try_start(nd, now)
    if progress is not None:
        progress(n & 255)
    for nd in nodes:
        await nd.sidecar.run_pending()


class ServedReplay:
    """Plays a trace through the engine cache in front of the sidecar's engine."""

    def __init__(self, requests: Sequence[Request], policy: str, config: ServedConfig,
                 cost: CostModel, options: Mapping[str, Any] | None = None) -> None:
        check_sidecar_tiers(config.sidecar)
        self.requests = requests
        self.policy = policy
        self.config = config
        self.cost = cost
        decode_ids = (decode_block_ids(requests, cost.block_tokens)
                      if config.decode_saves else None)
        self.node, side = engine_node(policy, config, cost, decode_ids, options)
        self.engine, self.mover, self.cache = side.engine, side.mover, self.node.cache

    async def run(self, progress: Callable[[int], None] | None = None) -> ServedResult:
        started = time.perf_counter()
        await play(self.requests, [self.node], None, progress)
        return self.node.result(time.perf_counter() - started)


async def replay_served(requests: Sequence[Request], policy: str, config: ServedConfig,
                        cost: CostModel, progress: Callable[[int], None] | None = None,
                        options: Mapping[str, Any] | None = None) -> ServedResult:
    """``requests`` through the served topology with ``policy`` (constructed with
    ``options``) behind the engine."""
    return await ServedReplay(requests, policy, config, cost, options).run(progress)
