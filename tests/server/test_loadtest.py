"""The bounded load test (issue 10): 64 clients for ~25 s against a real
``kvstore serve`` with a 64 MiB DRAM tier in front of disk, so evictions,
demotions, promotions and write-backs run throughout. Every block read is checked
against the bytes derived from its hash. The 60 s form is the benchmark command
``kvstore loadtest`` (docs/BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest

from kvstore.loadtest import LoadSpec, passed, run
from kvstore.loadtest.__init__ import _print

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: The server's RSS may not grow by more than this over the second half of the run
#: (least-squares trend; a 180 s run shows +4 MiB/min once warm). The old unbounded
#: Get (1.5 GB for one request) or a leak per operation (~25,000 operations) would
#: blow it.
SECOND_HALF_GROWTH_MIB = 48
PEAK_MIB = 512


def test_64_clients_mixed_load_reads_only_the_bytes_written(server_process, capsys):
    srv = server_process(KVSTORE_DRAM__CAPACITY="64MiB", KVSTORE_DISK__CAPACITY="1GiB")
    result = run(LoadSpec(clients=64, seconds=25), srv.address, srv.proc.pid)
    with capsys.disabled():
        print()
        _print(result)
    summary = {k: result[k] for k in ("total_ops", "wrong_blocks", "unexpected_errors",
                                      "refused", "final_check", "server_stats")}
    assert result["wrong_blocks"] == 0, result["samples"]
    assert result["unexpected_errors"] == 0, (result["unexpected"], result["samples"])
    assert result["final_check"]["wrong"] == 0
    assert result["server_stats"]["corrupt_reads"] == 0
    # (transfers_failed / demotions_failed may count copies skipped for want of room:
    # expected under saturation, so not asserted here; docs/RELIABILITY.md.)
    assert passed(result)
    # It exercised what it is for: every path read checked blocks, DRAM evicted.
    ops = result["ops"]
    for op in ("get_shm", "get_grpc", "get_into"):
        assert ops[op]["verified_blocks"] > 0, json.dumps(summary)
    for op in ("put_shm", "put_grpc", "lookup", "delete"):
        assert ops[op]["count"] > 0, json.dumps(summary)
    assert result["server_stats"]["tiers"]["dram"]["evictions"] > 0
    assert result["final_check"]["verified"] > 0
    mem = result["memory"]
    assert mem["second_half_growth_mib"] < SECOND_HALF_GROWTH_MIB, mem
    assert mem["peak_mib"] < PEAK_MIB, mem
    log = srv.log_path.read_text() if srv.log_path else ""
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]
