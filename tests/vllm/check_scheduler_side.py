"""The connector's scheduler side against fake requests and a fake sidecar.

Needs vLLM importable (the plan types subclass vLLM's), not an engine: runs in
seconds under the vLLM interpreter. ``test_connector_e2e.py`` runs it and
expects ``ok <name>`` for every check; standalone::

    .venv-vllm/bin/python tests/vllm/check_scheduler_side.py
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kvstore.connectors.vllm.config import ConnectorConfig
from kvstore.connectors.vllm.metadata import WorkerReport
from kvstore.connectors.vllm.scheduler import SchedulerSide
from kvstore.connectors.vllm.sidecar import SidecarLink

from kvstore.client import LookupResult
from kvstore.errors import Unavailable
from kvstore.types import Medium

BS = 4


@dataclass
class FakeRequest:
    request_id: str
    all_token_ids: list[int]
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def block_hashes(self) -> list[bytes]:
        toks = self.all_token_ids
        return [bytes([sum(toks[: (i + 1) * BS]) % 256]) * 32 for i in range(len(toks) // BS)]

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


@dataclass
class FakeBlocks:
    ids: list[int]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (self.ids,)


@dataclass
class NewReq:
    req_id: str
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclass
class CachedReqs:
    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_block_ids: list[tuple[list[int], ...] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedOut:
    scheduled_new_reqs: list[NewReq] = field(default_factory=list)
    scheduled_cached_reqs: CachedReqs = field(default_factory=CachedReqs)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)


class FakeClient:
    def __init__(self, stored: set[bytes], down: bool = False) -> None:
        self.stored, self.down = stored, down
        self.hints: list[tuple[Any, ...]] = []
        self.lookups: list[dict[str, Any]] = []
        self.keep_ms = 0.0  # the HBM keep the sidecar's policy answers

    def lookup(
        self, ns: str, hashes: list[bytes], session: str, workload: str, **kw: Any
    ) -> LookupResult:
        if self.down:
            raise Unavailable("down")
        self.lookups.append(kw)
        n = 0
        while n < len(hashes) and hashes[n] in self.stored:
            n += 1
        return LookupResult(n, (Medium.CPU,) * n, 0, self.keep_ms)

    def hint(self, *args: Any, **kwargs: Any) -> int:
        self.hints.append((args, kwargs))
        return 0

    def close(self) -> None:
        pass


def side(client: FakeClient, clock: Any = time.monotonic, **cfg: Any) -> SchedulerSide:
    link = SidecarLink("127.0.0.1:1", 1.0, 60.0, client_factory=lambda a, t: client)
    return SchedulerSide(ConnectorConfig(**cfg), link, "ns", BS, clock=clock)


def check_a_waiting_request_costs_one_lookup() -> None:
    """vLLM asks for a waiting request on every step it cannot schedule it: one Lookup
    answers them all until the request is scheduled, preempted, finished or the answer
    is older than lookup_max_age_s."""
    now = [100.0]
    req = FakeRequest("w", list(range(1, 13)))  # 3 full blocks
    client = FakeClient(set(req.block_hashes[:2]))
    s = side(client, clock=lambda: now[0], lookup_max_age_s=1.0)
    for step in range(50):  # 50 steps waiting, 10 ms apart, the local hit changing
        now[0] += 0.01
        assert s.get_num_new_matched_tokens(req, BS if step % 2 else 0) == (
            (1 if step % 2 else 2) * BS, True)
    assert len(client.lookups) == 1
    now[0] += 1.0  # older than lookup_max_age_s: asked again
    assert s.get_num_new_matched_tokens(req, 0) == (2 * BS, True)
    assert len(client.lookups) == 2
    # Scheduled (allocated), then preempted: it waits again and asks again.
    s.update_state_after_alloc(req, FakeBlocks([7, 8, 9]), 2 * BS)
    s.get_num_new_matched_tokens(req, 0)
    assert len(client.lookups) == 3
    s.build_connector_meta(SchedOut())
    s.get_num_new_matched_tokens(req, 0)
    assert len(client.lookups) == 3

    @dataclass
    class Preempted(SchedOut):
        preempted_req_ids: set[str] = field(default_factory=lambda: {"w"})

    s.build_connector_meta(Preempted())
    client.stored.add(req.block_hashes[2])  # the sidecar has more by now
    assert s.get_num_new_matched_tokens(req, 0) == (2 * BS, True)  # last token computed
    assert len(client.lookups) == 4 and s._reqs["w"].sidecar_blocks == 3
    # Finished: a new request under the same id is a new lookup.
    s.request_finished(req, [])
    s.get_num_new_matched_tokens(req, BS)
    assert len(client.lookups) == 5
    # Each lookup says vLLM's own prefix-cache hit (what it kept without a hold).
    assert client.lookups[0]["num_computed_tokens"] == 0
    assert client.lookups[-1]["num_computed_tokens"] == BS
    # lookup_max_age_s 0: every ask is a Lookup (the old behaviour, on purpose).
    eager_client = FakeClient(set())
    eager = side(eager_client, lookup_max_age_s=0.0)
    for _ in range(3):
        eager.get_num_new_matched_tokens(FakeRequest("e", list(range(1, 9))), 0)
    assert len(eager_client.lookups) == 3
    s.shutdown()
    eager.shutdown()


@dataclass
class Status:
    name: str


def check_hint_from_what_the_engine_saw() -> None:
    """The finished-side hint follows the request's stop and the tool-call markers; the
    lookup at submission said what the client claimed."""
    client = FakeClient(set())
    s = side(client, tool_call_stop_token_ids=(77,), tool_call_token_sequences=((5, 6, 7),))
    cases = {
        # id: (claimed after, status, stop_reason, output tokens) -> (event, source)
        "eom": ("user", "FINISHED_STOPPED", 77, [1, 2, 77], "tool_call", "stop_token"),
        "seq": (None, "FINISHED_STOPPED", None, [4, 5, 6, 7, 2], "tool_call",
                "token_sequence"),
        "seq-cap": (None, "FINISHED_LENGTH_CAPPED", None, [5, 6, 7, 9], "tool_call",
                    "token_sequence"),
        "stop": ("tool_call", "FINISHED_STOPPED", None, [1, 2], "turn_end", "stop"),
        "cap": ("tool_call", "FINISHED_LENGTH_CAPPED", None, [1, 2], "tool_call", "params"),
        "end": ("end", "FINISHED_STOPPED", 77, [77], "session_end", "params"),
        "plain": (None, "FINISHED_STOPPED", None, [1, 6, 7], "turn_end", "default"),
    }
    for rid, (after, status, reason, out, event, source) in cases.items():
        params = {"session_id": rid, "expected_gap_ms": 500}
        if after:
            params["after"] = after
        req = FakeRequest(rid, list(range(1, 9)), params)
        s.get_num_new_matched_tokens(req, 0)
        claimed = {"user": "turn_end", "tool_call": "tool_call", "end": "session_end",
                   None: "turn_end"}[after]
        assert client.lookups[-1]["then"] == claimed, (rid, client.lookups[-1])
        req.status, req.stop_reason, req.output_token_ids = Status(status), reason, out  # type: ignore[attr-defined]
        _, params_out = s.request_finished(req, [])
        kv = params_out["kvstore"] if params_out else {}
        assert (kv["event"], kv["event_source"]) == (event, source), (rid, kv)
        assert kv["event_claimed"] == claimed
    s.shutdown()
    sent = {kwargs["request_id"]: (args[1], kwargs["expected_gap_ms"])
            for args, kwargs in client.hints}
    assert sent == {
        "eom": ("tool_call", None),  # the claimed gap was for a user turn: dropped
        "seq": ("tool_call", None),
        "seq-cap": ("tool_call", None),
        "stop": ("turn_end", None),
        "cap": ("tool_call", 500),
        "end": ("session_end", 500),
        "plain": ("turn_end", 500),
    }, sent
    # No markers configured: the client's claim holds whatever the stop.
    plain_client = FakeClient(set())
    p = side(plain_client)
    req = FakeRequest("x", list(range(1, 9)), {"session_id": "x", "after": "tool_call"})
    p.get_num_new_matched_tokens(req, 0)
    req.status, req.stop_reason, req.output_token_ids = Status("FINISHED_STOPPED"), 77, [77]  # type: ignore[attr-defined]
    assert p.request_finished(req, [])[1]["kvstore"]["event"] == "tool_call"  # type: ignore[index]
    # A turn nobody described (no after, no gap), ended as the engine cannot tell:
    # its lookup says no ``then`` and its end sends no hint (the default is no news);
    # a tool-call marker the engine saw is news and is sent.
    quiet = FakeClient(set())
    q = side(quiet, tool_call_stop_token_ids=(77,))
    for rid, (reason, out) in {"q1": (None, [1, 2]), "q2": (77, [1, 77])}.items():
        req = FakeRequest(rid, list(range(1, 9)), {"session_id": rid})
        q.get_num_new_matched_tokens(req, 0)
        assert quiet.lookups[-1]["then"] == "", quiet.lookups[-1]
        req.status, req.stop_reason, req.output_token_ids = Status("FINISHED_STOPPED"), reason, out  # type: ignore[attr-defined]
        q.request_finished(req, [])
    q.shutdown()
    assert [(kwargs["request_id"], args[1]) for args, kwargs in quiet.hints] == [
        ("q2", "tool_call")], quiet.hints


def check_loads_stored_prefix_leaving_the_last_token() -> None:
    req = FakeRequest("r", list(range(1, 13)))  # 12 tokens, 3 full blocks
    s = side(FakeClient(set(req.block_hashes)))
    # All 3 blocks stored, but the last token must be computed: load 2 blocks.
    assert s.get_num_new_matched_tokens(req, 0) == (2 * BS, True)
    s.update_state_after_alloc(req, FakeBlocks([7, 8, 9]), 2 * BS)
    meta = s.build_connector_meta(
        SchedOut([NewReq("r", ([7, 8, 9],), 8)], num_scheduled_tokens={"r": 4})
    )
    (plan,) = meta.loads
    assert plan.block_ids == (7, 8) and plan.hashes == tuple(req.block_hashes[:2])
    assert not meta.saves  # block 2 is stored already: nothing to save


def check_loads_are_asynchronous_unless_configured_not_to_be() -> None:
    """``load_async`` (the default): vLLM is told to wait off the step, the plan is
    asynchronous, the receive is counted; finished while loading: no hold of ours (vLLM
    frees the blocks once the workers report the receive); a failed load is not
    offered again. ``load_async=False``: a synchronous plan."""
    req = FakeRequest("r", list(range(1, 13)), {"session_id": "s", "after": "tool_call"})
    client = FakeClient(set(req.block_hashes))
    client.keep_ms = 1000.0  # the policy would keep its blocks in the engine
    s = side(client, hold_max_ms=5000)
    assert s.get_num_new_matched_tokens(req, 0) == (2 * BS, True)
    s.update_state_after_alloc(req, FakeBlocks([7, 8, 9]), 2 * BS)
    (plan,) = s.build_connector_meta(SchedOut()).loads
    assert plan.asynchronous and plan.block_ids == (7, 8)
    delayed, params = s.request_finished(req, [7, 8])  # aborted while it loads
    assert delayed is False and params is not None and params["kvstore"]["held_ms"] == 0

    again = FakeRequest("a", list(range(1, 13)))
    s.get_num_new_matched_tokens(again, 0)
    s.update_state_after_alloc(again, FakeBlocks([3, 4, 5]), 2 * BS)
    s.build_connector_meta(SchedOut())

    class Out:
        kv_connector_worker_meta = WorkerReport(load_failed={"a": 2})
        finished_recving = {"a"}

    s.update_connector_output(Out())
    # Failed from its first block: vLLM frees its blocks and asks again; no load.
    assert s.get_num_new_matched_tokens(again, 0) == (0, False)
    kv = s.request_finished(again, [])[1]["kvstore"]  # type: ignore[index]
    assert kv["async_loads"] == 1 and kv["load_failed_tokens"] == 2 * BS
    assert kv["totals"]["async_loads"] == 1

    sync = side(FakeClient(set(req.block_hashes)), load_async=False)
    assert sync.get_num_new_matched_tokens(req, 0) == (2 * BS, False)
    sync.update_state_after_alloc(req, FakeBlocks([7, 8, 9]), 2 * BS)
    (plan,) = sync.build_connector_meta(SchedOut()).loads
    assert not plan.asynchronous
    for x in (s, sync):
        x.shutdown()


def check_local_hit_beyond_sidecar_and_min_load() -> None:
    req = FakeRequest("r", list(range(1, 22)))  # 5 full blocks
    s = side(FakeClient(set(req.block_hashes[:2])), min_load_blocks=2)
    assert s.get_num_new_matched_tokens(req, 3 * BS) == (0, False)  # local has more
    assert s.get_num_new_matched_tokens(req, 1 * BS) == (0, False)  # 1 block < min 2
    assert s.get_num_new_matched_tokens(req, 0) == (2 * BS, True)


def check_saves_blocks_as_they_fill_across_chunks_and_decode() -> None:
    req = FakeRequest("r", list(range(1, 11)), {"session_id": "s1", "workload": "chat"})
    s = side(FakeClient(set()))
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    s.update_state_after_alloc(req, FakeBlocks([4, 5, 6]), 0)
    # Chunked prefill: 6 of 10 prompt tokens this step fill block 0 only.
    m1 = s.build_connector_meta(
        SchedOut([NewReq("r", ([4, 5, 6],), 0)], num_scheduled_tokens={"r": 6})
    )
    assert [b.block_id for p in m1.saves for b in p.blocks] == [4]
    assert m1.saves[0].session_id == "s1" and m1.saves[0].workload == "chat"
    # The rest of the prompt fills block 1; block 2 holds 2 tokens.
    m2 = s.build_connector_meta(
        SchedOut(
            scheduled_cached_reqs=CachedReqs(["r"], set(), [None], [6]),
            num_scheduled_tokens={"r": 4},
        )
    )
    assert [b.block_id for p in m2.saves for b in p.blocks] == [5]
    save = m2.saves[0].blocks[0]
    assert save.parent_hash == req.block_hashes[0] and save.token_ids == (5, 6, 7, 8)
    # Decoding appends two tokens: block 2 fills and is saved.
    req.all_token_ids += [90, 91]
    m3 = s.build_connector_meta(
        SchedOut(
            scheduled_cached_reqs=CachedReqs(["r"], set(), [None], [11]),
            num_scheduled_tokens={"r": 1},
        )
    )
    assert [b.block_id for p in m3.saves for b in p.blocks] == [6]
    # Preempted and resumed: new block ids replace the old ones.
    req.all_token_ids += [92, 93, 94, 95]
    m4 = s.build_connector_meta(
        SchedOut(
            scheduled_cached_reqs=CachedReqs(["r"], {"r"}, [([1, 2, 3, 0],)], [0]),
            num_scheduled_tokens={"r": 16},
        )
    )
    assert [b.block_id for p in m4.saves for b in p.blocks] == [0]


def check_sidecar_down_means_no_hit() -> None:
    req = FakeRequest("r", list(range(1, 13)))
    s = side(FakeClient(set(req.block_hashes), down=True))
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)
    assert not s.link.is_up


def check_turn_end_hint_and_hold() -> None:
    """HBM keep is the sidecar policy's decision (``keep_ms`` with the lookup), capped
    by hold_max_ms, within the hold budget."""
    client = FakeClient(set())
    s = side(client, hold_max_ms=1000, hold_budget_blocks=3)
    tool = FakeRequest(
        "a",
        list(range(1, 9)),
        {"session_id": "s", "after": "tool_call", "expected_gap_ms": 400, "tool": "grep"},
    )
    client.keep_ms = 400.0
    s.get_num_new_matched_tokens(tool, 0)
    asked = client.lookups[-1]
    assert asked["request_id"] == "a" and asked["then"] == "tool_call"
    assert asked["tool"] == "grep" and asked["expected_gap_ms"] == 400
    held, params = s.request_finished(tool, [1, 2])
    assert held and params is not None and params["kvstore"]["held_ms"] == 400
    assert s.build_connector_meta(SchedOut()).holds == {"a": 0.4}
    # Keep 5 s, but 2 blocks more than the budget of 3 allows: released.
    client.keep_ms = 5000.0
    over = FakeRequest("b", list(range(1, 9)), {"session_id": "t", "after": "tool_call"})
    s.get_num_new_matched_tokens(over, 0)
    assert s.request_finished(over, [3, 4])[0] is False
    # The policy says release: released, whatever the client's gap.
    client.keep_ms = 0.0
    quick = FakeRequest("c", list(range(1, 9)), {"session_id": "u", "expected_gap_ms": 10})
    s.get_num_new_matched_tokens(quick, 0)
    assert s.request_finished(quick, [5])[0] is False
    # One block fits the budget; the policy's 5 s is capped at hold_max_ms.
    client.keep_ms = 5000.0
    fits = FakeRequest("d", list(range(1, 5)), {"session_id": "v", "after": "user"})
    s.get_num_new_matched_tokens(fits, 0)
    held, params = s.request_finished(fits, [6])
    assert held and params is not None
    kv = params["kvstore"]
    assert kv["held_ms"] == 1000 and kv["keep_ms"] == 5000
    assert kv["held_blocks"] == 3 == kv["held_blocks_max"] == kv["hold_budget_blocks"]
    s.shutdown()  # waits for the hint thread
    hints = {kwargs["request_id"]: (args[1], kwargs.get("tool")) for args, kwargs in client.hints}
    assert hints == {
        "a": ("tool_call", "grep"),
        "b": ("tool_call", None),
        "c": ("turn_end", None),
        "d": ("turn_end", None),
    }, hints


def check_worker_reports_reach_the_params() -> None:
    req = FakeRequest("r", list(range(1, 13)))
    s = side(FakeClient(set(req.block_hashes)))
    s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, FakeBlocks([7, 8, 9]), 2 * BS)
    s.build_connector_meta(SchedOut([NewReq("r", ([7, 8, 9],), 8)], num_scheduled_tokens={"r": 4}))

    class Out:
        kv_connector_worker_meta = WorkerReport(
            load_failed={"r": 1}, load_ms={"r": 3.0}, load_bytes={"r": 100}
        )

    s.update_connector_output(Out())
    _, params = s.request_finished(req, [7, 8, 9])
    kv = params["kvstore"] if params else {}
    assert kv["loaded_tokens"] == BS and kv["load_failed_tokens"] == BS and kv["load_ms"] == 3.0


def check_saved_requests_keep_their_blocks_until_the_workers_say() -> None:
    req = FakeRequest("r", list(range(1, 13)), {"session_id": "s", "after": "user"})  # 3 blocks
    s = side(FakeClient(set()))
    s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, FakeBlocks([4, 5, 6]), 0)
    meta = s.build_connector_meta(
        SchedOut([NewReq("r", ([4, 5, 6],), 0)], num_scheduled_tokens={"r": 12})
    )
    assert [b.block_id for p in meta.saves for b in p.blocks] == [4, 5, 6]
    assert not meta.idle
    # Its saves may still be queued on the workers: vLLM must keep the blocks,
    # and the turn's hint waits for them.
    delayed, params = s.request_finished(req, [4, 5, 6])
    assert delayed and params is not None and params["kvstore"]["held_ms"] == 0
    s._hints.submit(lambda: None).result()
    assert not s.link.call("x", lambda c: c.hints, None)  # nothing sent yet

    @dataclass
    class Preempting(SchedOut):
        preempted_req_ids: set[str] = field(default_factory=lambda: {"x"})
        total_num_scheduled_tokens: int = 0

    nxt = s.build_connector_meta(Preempting())
    assert nxt.holds == {"r": 0.0} and nxt.preempted == {"x"} and nxt.idle
    # A request that never had anything to save is freed at once.
    short = FakeRequest("q", [1, 2])
    s.get_num_new_matched_tokens(short, 0)
    assert s.request_finished(short, [9])[0] is False

    class Out:
        kv_connector_worker_meta = WorkerReport(saved={"r": 2}, save_ms=4.0, save_bytes=300)
        finished_sending: set[str] = set()

    s.update_connector_output(Out())
    def hints_for_s() -> list[str]:
        s._hints.submit(lambda: None).result()
        return [h[0][1] for h in s.link.call("x", lambda c: c.hints, []) if h[0][0] == "s"]

    assert hints_for_s() == []  # one block still unsaved
    Out.kv_connector_worker_meta = WorkerReport(save_failed={"r": 1})
    s.update_connector_output(Out())
    assert hints_for_s() == ["turn_end"]
    totals = s.request_finished(FakeRequest("t", [1]), [])[1]["kvstore"]["totals"]  # type: ignore[index]
    assert totals["saved_blocks"] == 2 and totals["save_failed_blocks"] == 1
    assert totals["save_bytes"] == 300 and totals["save_ms"] == 4


def main() -> None:
    started = time.monotonic()
    for name, fn in sorted(globals().items()):
        if name.startswith("check_") and callable(fn):
            fn()
            print(f"ok {name}", flush=True)
    print(f"all ok in {time.monotonic() - started:.2f} s")


if __name__ == "__main__":
    main()
