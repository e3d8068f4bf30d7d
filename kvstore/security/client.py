"""Client side: what a client sends to prove who it is, and how it checks the server.

``ClientSecurity`` comes from arguments or, by default, the environment::

    KVSTORE_TOKEN            bearer token (sent as 'authorization: Bearer <token>')
    KVSTORE_TLS              1 / true: connect with TLS (implied by the three below)
    KVSTORE_TLS_CA           PEM CA bundle that signs the server's certificate
                             (default with TLS on: the system's roots)
    KVSTORE_TLS_CERT         PEM client certificate (mutual TLS), with KVSTORE_TLS_KEY
    KVSTORE_TLS_KEY
    KVSTORE_TLS_SERVER_NAME  name to check the server's certificate against, when it is
                             not the host of the address (e.g. connecting by IP)

With TLS on the server is always verified; there is no switch to skip that.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from kvstore.errors import ConfigError
from kvstore.security.config import is_loopback

__all__ = ["ClientSecurity"]

log = logging.getLogger(__name__)

_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    token: str = field(default="", repr=False)  # (never in logs)
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientSecurity:
        env = os.environ if env is None else env
        ca, cert, key = (env.get(f"KVSTORE_TLS_{k}", "") for k in ("CA", "CERT", "KEY"))
        tls = env.get("KVSTORE_TLS", "").lower() in _TRUE or bool(ca or cert)
        sec = cls(token=env.get("KVSTORE_TOKEN", ""), tls=tls, ca_file=ca, cert_file=cert,
                  key_file=key, server_name=env.get("KVSTORE_TLS_SERVER_NAME", ""))
        sec.validate("KVSTORE_TLS_")
        return sec

    def merged(self, token: str | None = None, tls: bool | None = None, ca_file: str = "",
               cert_file: str = "", key_file: str = "", server_name: str = ""
               ) -> ClientSecurity:
        """These settings where given, this object's (e.g. the environment's) elsewhere."""
        sec = ClientSecurity(
            token=self.token if token is None else token,
            tls=(self.tls or bool(ca_file or cert_file)) if tls is None else tls,
            ca_file=ca_file or self.ca_file, cert_file=cert_file or self.cert_file,
            key_file=key_file or self.key_file, server_name=server_name or self.server_name)
        sec.validate()
        return sec

    def validate(self, prefix: str = "") -> None:
        def name(key: str) -> str:
            return f"{prefix}{key.removesuffix('_file').upper()}" if prefix else key

        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError(f"{name('cert_file')} / {name('key_file')}: a client "
                              "certificate needs its key, and the other way round")
        if (self.ca_file or self.cert_file) and not self.tls:
            raise ConfigError(f"{name('ca_file')} / {name('cert_file')}: need TLS on")
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            if path and not os.path.isfile(path):
                raise ConfigError(f"{name(key)}: no such file {path!r}")

    def _credentials(self) -> grpc.ChannelCredentials:
        def read(path: str) -> bytes | None:
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file), private_key=read(self.key_file),
            certificate_chain=read(self.cert_file))

    def _options(self, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        out = list(options)
        if self.server_name:
            out.append(("grpc.ssl_target_name_override", self.server_name))
        return out

    def _warn_plaintext(self, address: str) -> None:
        if self.token and not self.tls and not is_loopback(address):
            log.warning("sending a bearer token to %s without TLS: anyone on the path can "
                        "read it (set KVSTORE_TLS / tls=True)", address)

    def channel(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        self._warn_plaintext(address)
        opts = self._options(options)
        ch = (grpc.secure_channel(address, self._credentials(), options=opts) if self.tls
              else grpc.insecure_channel(address, options=opts))
        if self.token:
            ch = grpc.intercept_channel(ch, _SyncToken(self.token))
        return ch

    def aio_channel(self, address: str, options: Sequence[tuple[str, Any]] = ()
                    ) -> grpc.aio.Channel:
        self._warn_plaintext(address)
        opts = self._options(options)
        interceptors = _aio_token(self.token) if self.token else None
        if self.tls:
            return grpc.aio.secure_channel(address, self._credentials(), options=opts,
                                           interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)


def _with_token(metadata: Any, token: str) -> list[tuple[str, str]]:
    return [*(metadata or ()), ("authorization", f"Bearer {token}")]


_Fields = collections.namedtuple(
    "_Fields", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"))


class _SyncDetails(_Fields, grpc.ClientCallDetails):  # type: ignore[misc]
    pass


_SyncInterceptors: tuple[type, ...] = (
    grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor)


class _SyncToken(*_SyncInterceptors):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, d: Any) -> _SyncDetails:
        return _SyncDetails(d.method, d.timeout, _with_token(d.metadata, self._token),
                            d.credentials, getattr(d, "wait_for_ready", None),
                            getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def _aio_token(token: str) -> list[grpc.aio.ClientInterceptor]:
    def details(d: Any) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(d.method, d.timeout, _with_token(d.metadata, token),
                                          d.credentials, d.wait_for_ready)

    class UU(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_unary(self, continuation: Any, d: Any, request: Any) -> Any:
            return await continuation(details(d), request)

    class US(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_stream(self, continuation: Any, d: Any, request: Any) -> Any:
            return await continuation(details(d), request)

    class SU(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_unary(self, continuation: Any, d: Any, requests: Any
                                         ) -> Any:
            return await continuation(details(d), requests)

    class SS(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_stream(self, continuation: Any, d: Any, requests: Any
                                          ) -> Any:
            return await continuation(details(d), requests)

    return [UU(), US(), SU(), SS()]
