"""TLS and mutual TLS: certificates made with openssl in a temporary directory; each
refused connection checks that nothing stored changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstore import KVStoreClient
from kvstore.config import load_config
from kvstore.errors import ConfigError, PermissionDenied, Unauthenticated, Unavailable
from kvstore.security.client import ClientSecurity
from tests.blocks import make_chain
from tests.server.auth_helpers import MTLS_TENANTS, TENANTS, TOKENS, Pki, make_pki, stored

BLOCKS = make_chain(4, 4096, seed=11)
HASHES = [bytes(b.block_hash) for b in BLOCKS]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls(pki: Pki, **more: Any) -> dict[str, Any]:
    return {"cert_file": pki.path("server.crt"), "key_file": pki.path("server.key"), **more}


def _client(pki: Pki, address: str, cert: str = "", **kw: Any) -> KVStoreClient:
    sec = ClientSecurity(tls=True, ca_file=pki.path("ca.crt"),
                         cert_file=pki.path(f"{cert}.crt") if cert else "",
                         key_file=pki.path(f"{cert}.key") if cert else "")
    return KVStoreClient(address, security=sec, timeout=5, **kw)


def _mtls_server(server_factory: Any, pki: Pki, **auth: Any) -> Any:
    return server_factory(tls=_tls(pki, client_ca_file=pki.path("ca.crt"),
                                   require_client_cert=True), **auth)


@pytest.mark.parametrize("shared_memory", [False, None], ids=["grpc", "auto"])
def test_tls_round_trip(server_factory: Any, pki: Pki, shared_memory: bool | None) -> None:
    srv = server_factory(tls=_tls(pki))
    with _client(pki, srv.address, shared_memory=shared_memory) as c:
        assert c.put("ns", BLOCKS) == len(BLOCKS)
        assert [b.payload if b else None for b in c.get("ns", HASHES)] == \
            [b.payload for b in BLOCKS]


def test_client_without_the_ca_refuses_the_server(server_factory: Any, pki: Pki,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    srv = server_factory(tls=_tls(pki))
    with _client(pki, srv.address) as c:
        c.put("ns", BLOCKS)
    before = stored(srv)
    # The system's roots do not sign the test CA: the server is not trusted.
    with KVStoreClient(srv.address, security=ClientSecurity(tls=True), timeout=5) as c, \
            pytest.raises(Unavailable):
        c.put("ns", make_chain(2, 4096, seed=12))
    # Nor is a server signed by another CA than the one the client trusts.
    monkeypatch.setenv("KVSTORE_TLS_CA", pki.path("rogue-ca.crt"))
    with KVStoreClient(srv.address, timeout=5) as c, pytest.raises(Unavailable):
        c.delete("ns", HASHES)
    # Plaintext against a TLS port gets nowhere either.
    with KVStoreClient(srv.address, security=ClientSecurity(), timeout=5) as c, \
            pytest.raises(Unavailable):
        c.delete("ns", HASHES)
    assert stored(srv) == before


def test_client_trusts_the_ca_from_the_environment(server_factory: Any, pki: Pki,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    srv = server_factory(tls=_tls(pki))
    monkeypatch.setenv("KVSTORE_TLS_CA", pki.path("ca.crt"))
    with KVStoreClient(srv.address, timeout=5) as c:
        assert c.security.tls
        assert c.put("ns", BLOCKS) == len(BLOCKS)


def test_mutual_tls_refuses_clients_without_a_good_certificate(server_factory: Any,
                                                              pki: Pki) -> None:
    srv = _mtls_server(server_factory, pki)
    with _client(pki, srv.address, cert="tenant-a") as c:
        assert c.put("ns", BLOCKS) == len(BLOCKS)  # no tenants: the CA's clients are trusted
    before = stored(srv)
    with _client(pki, srv.address) as c, pytest.raises(Unavailable):
        c.delete("ns", HASHES)
    with _client(pki, srv.address, cert="rogue") as c, pytest.raises(Unavailable):
        c.delete("ns", HASHES)
    assert stored(srv) == before


def test_client_certificates_map_to_tenants(server_factory: Any, pki: Pki) -> None:
    srv = _mtls_server(server_factory, pki, auth={"tenants": MTLS_TENANTS})
    with _client(pki, srv.address, cert="tenant-a") as c:
        assert c.put("a/m", BLOCKS) == len(BLOCKS)
    before = stored(srv)
    with _client(pki, srv.address, cert="tenant-b") as c:
        with pytest.raises(PermissionDenied):
            c.get("a/m", HASHES)
        with pytest.raises(PermissionDenied):
            c.delete("a/m", HASHES)
    with _client(pki, srv.address, cert="stranger") as c, pytest.raises(Unauthenticated):
        c.lookup("a/m", HASHES)
    assert stored(srv) == before
    # A token names the tenant even over another tenant's certificate.
    sec = ClientSecurity(token=TOKENS["b"], tls=True, ca_file=pki.path("ca.crt"),
                         cert_file=pki.path("tenant-a.crt"), key_file=pki.path("tenant-a.key"))
    with KVStoreClient(srv.address, security=sec, timeout=5) as c, \
            pytest.raises(PermissionDenied):
        c.lookup("a/m", HASHES)


def test_tls_with_tokens(server_factory: Any, pki: Pki) -> None:
    srv = server_factory(tls=_tls(pki), auth={"tenants": TENANTS})
    sec = ClientSecurity(token=TOKENS["a"], tls=True, ca_file=pki.path("ca.crt"))
    with KVStoreClient(srv.address, security=sec, timeout=5) as c:
        assert c.put("a/m", BLOCKS) == len(BLOCKS)
    with _client(pki, srv.address) as c, pytest.raises(Unauthenticated):
        c.lookup("a/m", HASHES)


@pytest.mark.parametrize(("tls", "message"), [
    ({"cert_file": "server.crt"}, "tls.cert_file / tls.key_file: set both"),
    ({"require_client_cert": True}, "client certificates need TLS"),
    ({"cert_file": "server.crt", "key_file": "server.key", "require_client_cert": True},
     "tls.require_client_cert: needs tls.client_ca_file"),
    ({"cert_file": "missing.crt", "key_file": "server.key"}, "tls.cert_file: no such file"),
])
def test_bad_tls_config_names_the_key(pki: Pki, tls: dict[str, Any], message: str) -> None:
    tls = {k: pki.path(v) if isinstance(v, str) else v for k, v in tls.items()}
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, overrides={"tls": tls})


def test_bad_client_tls_settings_name_the_variable(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KVSTORE_TLS_CERT / KVSTORE_TLS_KEY"):
        ClientSecurity.from_env({"KVSTORE_TLS_CERT": pki.path("tenant-a.crt")})
    with pytest.raises(ConfigError, match="KVSTORE_TLS_CA: no such file"):
        ClientSecurity.from_env({"KVSTORE_TLS_CA": str(tmp_path / "nope.crt")})


def test_kvstore_serve_and_stats_commands_with_tls_and_a_token(
        server_process: Any, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real commands: `kvstore serve` configured through the environment, `kvstore
    stats` taking its credentials from it."""
    import os
    import subprocess
    import sys

    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[[tenants]]\nname = "ops"\ntoken_env = "OPS_TOKEN"\n'
                       'namespaces = ["*"]\nrights = ["read", "admin"]\n')
    monkeypatch.setenv("KVSTORE_TOKEN", "ops-secret")  # (the fixture's readiness probe)
    monkeypatch.setenv("KVSTORE_TLS_CA", pki.path("ca.crt"))
    srv = server_process(KVSTORE_AUTH__TENANTS_FILE=str(tenants), OPS_TOKEN="ops-secret",
                         KVSTORE_TLS__CERT_FILE=pki.path("server.crt"),
                         KVSTORE_TLS__KEY_FILE=pki.path("server.key"))

    def stats(**env: str) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if k != "KVSTORE_TOKEN"}
        return subprocess.run([sys.executable, "-m", "kvstore", "stats", "--address",
                               srv.address], env={**base, **env}, capture_output=True,
                              text=True, timeout=60)

    ok = stats(KVSTORE_TOKEN="ops-secret")
    assert ok.returncode == 0 and "0 blocks in 0 namespaces" in ok.stdout, ok.stderr
    refused = stats()
    assert refused.returncode != 0 and "no credential" in refused.stderr
