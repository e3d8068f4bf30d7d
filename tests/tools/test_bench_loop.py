"""``kvstore bench-loop`` runs the real server's calls in process and reports CPU per call:
the served path, the same handler object the gRPC server runs, on the server's embedded
defaults and the loop ``kvstore serve`` runs on (issue 25)."""

from __future__ import annotations

import asyncio
from typing import Any

from kvstore.config import Config
from kvstore.server import app
from kvstore.server.servicer import KVStoreServicer
from kvstore.tools import bench_loop


def test_bench_loop_times_a_lookup_and_each_block_operation() -> None:
    r = bench_loop.run(lookups=5, block=4096, blocks=8, batches=1)
    for key in ("lookup_1000", "lookup_1000_named"):
        assert r[key]["calls"] == 5
        assert 0 < r[key]["min_ms"] <= r[key]["p50_ms"]
        assert r[key]["after_p50_ms"] > 0  # the hits' bookkeeping, after the answer
    for op in ("reserve", "commit", "acquire", "reserve_alone", "commit_alone"):
        assert 0 < r["per_block"][op]["min_us"] <= r["per_block"][op]["p50_us"]
        # the longest hold spans the call itself: never 0 (a ticker cancelled before
        # its turn after the call counted none)
        assert 0 < r["longest_hold_ms"][op]["p50"] <= r["longest_hold_ms"][op]["max"]
    # the slots hold what was committed: every write-back passed its checksum
    assert r["transfers_failed"] == 0


def test_bench_loop_times_the_servicer_the_grpc_server_runs(monkeypatch: Any) -> None:
    """Every call bench-loop times goes to the one servicer the server registered with
    its gRPC server, on ``kvstore serve``'s tiers (DRAM and disk, the blocks written
    back), policy and event loop; none to a servicer of its own making."""
    made: list[KVStoreServicer] = []
    registered: list[Any] = []
    served: list[tuple[str, Any, Any]] = []
    init = KVStoreServicer.__init__
    add = app.kvstore_pb2_grpc.add_KVStoreServicer_to_server

    def counted_init(self: KVStoreServicer, *a: Any, **kw: Any) -> None:
        made.append(self)
        init(self, *a, **kw)

    def counted_add(servicer: Any, server: Any) -> None:
        registered.append(servicer)
        add(servicer, server)

    monkeypatch.setattr(KVStoreServicer, "__init__", counted_init)
    monkeypatch.setattr(app.kvstore_pb2_grpc, "add_KVStoreServicer_to_server", counted_add)
    for name in ("Lookup", "Reserve", "Commit", "Acquire"):
        handler = getattr(KVStoreServicer, name)

        def spy(self: Any, request: Any, context: Any, *, _h: Any = handler,
                _n: str = name) -> Any:
            served.append((_n, self, type(asyncio.get_running_loop()).__module__))
            return _h(self, request, context)

        monkeypatch.setattr(KVStoreServicer, name, spy)
    r = bench_loop.run(lookups=3, block=4096, blocks=4, batches=1)
    assert len(made) == 1 and registered == made  # the gRPC server's, and only it
    assert {n for n, _, _ in served} == {"Lookup", "Reserve", "Commit", "Acquire"}
    assert all(sv is made[0] for _, sv, _ in served)
    assert {loop for _, _, loop in served} == {"uvloop"}  # kvstore serve's loop
    defaults = Config()
    assert r["tiers"] == ["dram", "disk"] and r["policy"] == defaults.engine.policy
