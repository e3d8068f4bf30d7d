"""Live replay: the same requests against a running server give the offline table's
hit rate (issue: the policy as users get it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kvstore.policies.cost import CostModel

from kvstore.replay import cli
from kvstore.replay.generate import GenConfig, generate
from kvstore.replay.live import payload_for, replay_live
from kvstore.replay.trace import dump_trace
from tests.replay.helpers import replay

KiB = 1024
PAYLOAD = 16 * KiB


@pytest.mark.parametrize("policy", ["lru", "workload"])
def test_live_replay_matches_offline(server_factory, policy: str) -> None:
    """LRU is blind to time, so the compressed clock changes nothing: live and offline
    agree within a point. ``workload`` learns gaps on the server's clock: at this
    speedup its table is still close (the figures at 1x are in docs/BENCHMARKS.md)."""
    trace = generate("chat", GenConfig(sessions=40, duration_s=300.0, seed=3, scale=0.2))
    dram, disk = 60, 240
    srv = server_factory(engine={"policy": policy},
                         dram={"capacity": str(dram * PAYLOAD)},
                         disk={"capacity": str(disk * PAYLOAD)})
    cost = CostModel()
    live = asyncio.run(replay_live(trace, srv.address, cost, PAYLOAD, speedup=30.0))
    offline = replay(trace, policy, [("dram", dram), ("disk", disk)], cost)
    assert live.requests == offline.requests == len(trace)
    assert live.lookups == offline.lookups
    assert live.tiers == {"dram": dram, "disk": disk}
    assert live.hit_rate > 0.05
    tolerance = 0.01 if policy == "lru" else 0.05
    assert abs(live.hit_rate - offline.hit_rate) <= tolerance, (live, offline)
    # The bytes the server holds are the ones the replay wrote.
    from kvstore import KVStoreClient

    with KVStoreClient(srv.address) as c:
        h = trace[0].hash_ids[0].to_bytes(8, "big")
        got = c.get("trace", [h])[0]
        assert got is None or got.payload == payload_for(h, PAYLOAD)


def test_replay_cli_against_a_server(server_factory, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    srv = server_factory(dram={"capacity": str(40 * PAYLOAD)}, disk={"enabled": False})
    path = tmp_path / "t.jsonl"
    dump_trace(generate("agent", GenConfig(sessions=5, duration_s=60.0, seed=1, scale=0.05)),
               path)
    assert cli.main(["replay", str(path), "--server", srv.address, "--speedup", "100",
                     "--payload-bytes", str(PAYLOAD), "--limit", "40", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "adaptive (live)" in out and "dram blocks" in out  # the server's default policy
    assert cli.main(["replay", str(path), "--server", srv.address, "--speedup", "0"]) == 2
