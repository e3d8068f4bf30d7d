"""Tenants, credentials and a view of what a server stores, for the auth and TLS tests."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from kvstore import BlockData
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb

TOKENS = {"a": "token-a", "b": "token-b", "admin": "token-admin", "reader": "token-reader",
          "router": "token-router", "noshm": "token-noshm"}

TENANTS: list[dict[str, Any]] = [
    {"name": "a", "token": TOKENS["a"], "namespaces": ["a/*"], "rights": ["read", "write"]},
    {"name": "b", "token": TOKENS["b"], "namespaces": ["b/*"], "rights": ["read", "write"]},
    {"name": "admin", "token": TOKENS["admin"], "namespaces": ["*"],
     "rights": ["read", "write", "admin", "events"]},
    {"name": "reader", "token": TOKENS["reader"], "namespaces": ["a/*"], "rights": ["read"]},
    {"name": "router", "token": TOKENS["router"], "namespaces": ["*"], "rights": ["events"]},
    {"name": "noshm", "token": TOKENS["noshm"], "namespaces": ["c/*"],
     "rights": ["read", "write"], "shared_memory": False},
]

#: The same, with client-certificate names for a and b (mutual TLS).
MTLS_TENANTS = [{**t, "cert_names": [f"tenant-{t['name']}"]} if t["name"] in ("a", "b") else t
                for t in TENANTS]


def metadata(tenant: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {TOKENS.get(tenant, tenant)}")] if tenant else []


def stored(server: Any) -> dict[tuple[str, bytes], int]:
    """(namespace, hash) -> checksum of every block the server's index holds."""
    async def snap() -> dict[tuple[str, bytes], int]:
        return {(e.key.namespace, bytes(e.key.block_hash)): e.meta.checksum
                for e in server.engine.index.entries()}

    server.drain()
    result: dict[tuple[str, bytes], int] = server.run(snap())
    return result


def header(b: BlockData) -> pb.BlockHeader:
    return pb.BlockHeader(block_hash=bytes(b.block_hash), parent_hash=bytes(b.parent_hash or b""),
                          token_ids=list(b.token_ids), size=len(b.payload))


def code_of(exc: BaseException) -> grpc.StatusCode:
    assert isinstance(exc, grpc.RpcError), exc
    code: grpc.StatusCode = exc.code()
    return code


@dataclass(frozen=True)
class Pki:
    """A test CA and certificates it signed, plus a CA nobody trusts and its client."""

    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _leaf(cwd: Path, ca: str, name: str, ext: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=cwd)
    (cwd / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-sha256",
             "-extfile", f"{name}.ext", cwd=cwd)


def _ca(cwd: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=cwd)


def make_pki(root: Path) -> Pki:
    """ca.crt; server.{crt,key} for localhost / 127.0.0.1; tenant-a, tenant-b and
    stranger (a client name no tenant lists) signed by ca; rogue (a client of another CA)."""
    root.mkdir(parents=True, exist_ok=True)
    _ca(root, "ca")
    _ca(root, "rogue-ca")
    _leaf(root, "ca", "server", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
          "extendedKeyUsage=serverAuth\n")
    for client in ("tenant-a", "tenant-b", "stranger"):
        _leaf(root, "ca", client, f"subjectAltName=DNS:{client}\nextendedKeyUsage=clientAuth\n")
    _leaf(root, "rogue-ca", "rogue", "subjectAltName=DNS:tenant-a\n"
          "extendedKeyUsage=clientAuth\n")
    return Pki(root)
