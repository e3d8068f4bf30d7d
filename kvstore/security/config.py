"""The ``[auth]`` and ``[tls]`` sections of the server config.

::

    [auth]
    tenants_file = "/etc/kvstore/tenants.toml"   # [[tenants]] tables, same keys as below
    # allow_unauthenticated = true   # serve a non-loopback address with no credentials

    [[auth.tenants]]
    name = "acme"
    token_env = "ACME_TOKEN"          # or token = "..." / token_sha256 = "<hex>"
    namespaces = ["vllm/acme/*"]     # exact names, prefixes ending in *, or "*"
    rights = ["read", "write"]       # read, write, admin, events
    cert_names = ["acme-worker"]     # client-certificate CN / SAN names (mutual TLS)

    [tls]
    cert_file = "/etc/kvstore/tls/server.crt"
    key_file = "/etc/kvstore/tls/server.key"
    client_ca_file = "/etc/kvstore/tls/ca.crt"   # verify client certificates with it
    require_client_cert = true                    # mutual TLS

No tenants and no required client certificate = open: allowed only on a loopback
address unless ``allow_unauthenticated`` (checked at server start).
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.errors import ConfigError
from kvstore.security.grants import TenantTable, parse_tenants

__all__ = ["AuthConfig", "TlsConfig", "is_loopback"]


def is_loopback(listen: str) -> bool:
    """``127.0.0.1:50051``, ``[::1]:1``, ``localhost:1``, ``unix:...`` -> True."""
    if listen.startswith("unix:"):
        return True
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class AuthConfig:
    #: ``[[auth.tenants]]`` tables (see :mod:`kvstore.security.grants`); may hold tokens,
    #: so never in repr.
    tenants: tuple[Any, ...] = field(default=(), repr=False)
    #: A TOML file of ``[[tenants]]`` tables (kept out of the main config: it holds secrets).
    tenants_file: str = ""
    #: Serve a non-loopback address with no credentials configured.
    allow_unauthenticated: bool = False

    def table(self, env: Any = None) -> TenantTable:
        """Every tenant, from the file then the inline tables; errors name the key."""
        raw: list[Any] = []
        if self.tenants_file:
            path = Path(self.tenants_file)
            try:
                data = tomllib.loads(path.read_text())
            except OSError as exc:
                raise ConfigError(
                    f"auth.tenants_file: cannot read {str(path)!r}: {exc.strerror}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(
                    f"auth.tenants_file: {str(path)!r} is not valid TOML: {exc}") from exc
            unknown = sorted(set(data) - {"tenants"})
            if unknown:
                raise ConfigError(f"auth.tenants_file: unknown key {unknown[0]!r} in "
                                  f"{str(path)!r}; expected [[tenants]] tables")
            raw = data.get("tenants", [])
            parse_tenants(raw, f"auth.tenants_file {str(path)!r}: tenants", env)
        inline = list(self.tenants)
        parse_tenants(inline, "auth.tenants", env)
        # Together: a name, token or certificate name in both is refused too.
        return parse_tenants(list(raw) + inline, "auth.tenants + auth.tenants_file", env)

    def validate(self) -> None:
        if not isinstance(self.tenants, list | tuple):
            raise ConfigError(f"auth.tenants: expected a list of tables, got {self.tenants!r}")
        self.table()


def _readable(path: str, what: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"{what}: no such file {path!r}")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{what}: {path!r} is not readable")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    #: PEM server certificate (chain); set with key_file to serve TLS.
    cert_file: str = ""
    key_file: str = ""
    #: PEM CA bundle that signs client certificates (mutual TLS).
    client_ca_file: str = ""
    #: Refuse clients without a certificate that client_ca_file signed.
    require_client_cert: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)

    def validate(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("tls.cert_file / tls.key_file: set both to serve TLS, or neither "
                              f"(cert_file={self.cert_file!r}, key_file={self.key_file!r})")
        if (self.client_ca_file or self.require_client_cert) and not self.cert_file:
            raise ConfigError("tls.client_ca_file / tls.require_client_cert: client "
                              "certificates need TLS; set tls.cert_file and tls.key_file")
        if self.require_client_cert and not self.client_ca_file:
            raise ConfigError("tls.require_client_cert: needs tls.client_ca_file (the CA that "
                              "signs client certificates)")
        for name in ("cert_file", "key_file", "client_ca_file"):
            if value := getattr(self, name):
                _readable(value, f"tls.{name}")
