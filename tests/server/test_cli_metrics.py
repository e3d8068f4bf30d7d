"""The CLI and /metrics against a real server process."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kvstore import KVStoreClient
from tests.blocks import make_chain
from tests.conftest import free_port

KVSTORE = str(Path(sys.executable).parent / "kvstore")


def test_stats_cli_and_prometheus_metrics(server_process):
    port = free_port()
    srv = server_process(metrics_port=port)
    blocks = make_chain(5, 8192)
    with KVStoreClient(srv.address) as c:
        c.put("ns", blocks)
        c.lookup("ns", [b.block_hash for b in blocks] + [b"\x00" * 32])
        while c.stats().pending_moves:
            time.sleep(0.05)
    out = subprocess.run([KVSTORE, "stats", "--address", srv.address], capture_output=True,
                         text=True, check=True).stdout
    assert "5 blocks in 1 namespaces" in out and "dram" in out and "disk" in out
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'kvstore_tier_blocks{tier="dram"} 5.0' in body
    assert "kvstore_lookup_hit_blocks_total 5.0" in body
    assert "kvstore_lookup_miss_blocks_total 1.0" in body
    # write-back to disk went through the timed tier decorator
    puts = re.search(r'kvstore_tier_op_seconds_count\{op="put",tier="disk"\} (\S+)', body)
    assert puts and float(puts.group(1)) >= 1


def test_bad_config_exits_2_naming_the_field(tmp_path):
    cfg = tmp_path / "kv.toml"
    cfg.write_text('[dram]\ncapacity = "lots"\n')
    r = subprocess.run([KVSTORE, "serve", "--config", str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "dram.capacity" in r.stderr and "lots" in r.stderr


def test_stats_of_a_dead_server_is_a_clear_error():
    r = subprocess.run([KVSTORE, "stats", "--address", f"127.0.0.1:{free_port()}", "--timeout",
                        "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unreachable" in r.stderr
