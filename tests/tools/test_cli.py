"""Every tool is a ``kvstore <tool>`` subcommand (kvstore.tools), and the one harness
(:class:`kvstore.tools.harness.LocalServer`) says what went wrong when a server does not start."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore import cli
from kvstore.tools import PASSTHROUGH
from kvstore.tools.harness import LocalServer, free_port, temporary_server, to_toml

TOOLS = ("bench", "loadtest", "events", *PASSTHROUGH)


def test_kvstore_help_lists_every_tool(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in TOOLS:
        assert f"    {name}" in out, name


@pytest.mark.parametrize("name", sorted(PASSTHROUGH))
def test_each_passthrough_tool_runs_its_own_parser(name: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"kvstore {name}" in out, out[:500]


def test_bench_tiers_names_its_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench-tiers", "nonsense"]) == 2
    out = capsys.readouterr().out
    for sub in ("dram", "disk", "alloc", "restart"):
        assert f"kvstore bench-tiers {sub}" in out


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    server = LocalServer(tmp_path / "data", env={"KVSTORE_DRAM__CAPACITY": "lots"})
    with pytest.raises(RuntimeError, match=r"(?s)exited with 2; log .*dram\.capacity.*lots"):
        server.start(timeout=60)
    assert server.log_path.exists()


def test_temporary_server_serves_and_removes_its_data_dir() -> None:
    from kvstore.client import KVStoreClient

    with temporary_server() as server:
        data = server.data_dir
        with KVStoreClient(server.address, shared_memory=False) as c:
            assert c.stats().blocks == 0
        assert data.exists()
    assert server.proc is not None and server.proc.poll() is not None
    assert not data.exists()


def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(tmp_path: Path
                                                                        ) -> None:
    import socket

    server = LocalServer(tmp_path / "data")
    taken = server.port
    with socket.socket() as squatter:  # what a client's outgoing connection did once in CI
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with server:
            assert server.port != taken
            from kvstore.client import KVStoreClient

            with KVStoreClient(server.address, shared_memory=False) as c:
                assert c.stats().blocks == 0
    asked = LocalServer(tmp_path / "data2", port=taken)  # a port asked for is not changed
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with pytest.raises(RuntimeError, match="cannot bind"):
            asked.start(timeout=60)
    assert asked.port == taken


def test_free_port_and_toml() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    port = free_port()
    assert 10_000 <= port < low  # below the range clients' connections are given
    assert to_toml({"engine": {"policy": "lru", "x": 2, "on": True}}) == \
        '[engine]\npolicy = "lru"\nx = 2\non = true\n'


def test_the_server_runs_the_code_this_process_imported_wherever_it_is_started_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m kvstore`` puts its working folder first on the path, before
    ``PYTHONPATH``: a benchmark of another tree started from this one's folder (or from
    any folder holding a ``kvstore``) ran that folder's server. The default command runs
    from the tree this process imported ``kvstore`` from."""
    from kvstore.client import KVStoreClient

    other = tmp_path / "other-tree" / "kvstore"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "__main__.py").write_text("raise SystemExit('the wrong tree ran: 7')\n")
    monkeypatch.chdir(other.parent)
    with LocalServer(tmp_path / "data") as server, \
            KVStoreClient(server.address, shared_memory=False) as c:
        assert c.stats().blocks == 0
    assert "the wrong tree ran" not in server.log_path.read_text()
