"""Server side: the port's credentials (TLS, mutual TLS) and the interceptor that
authenticates every call and checks it against the caller's grant.

The interceptor wraps each KVStore method's handler: before the servicer runs it
finds the tenant (a bearer token in the ``authorization`` metadata, else the client
certificate's CN / SAN names), then checks the right and the namespace the request
names; a ``Put`` stream is checked message by message, before each is stored. A
refusal is ``UNAUTHENTICATED`` (no or unknown credential) or ``PERMISSION_DENIED``
(outside the grant), with a ``kvstore-error`` trailer like every servicer error, and
nothing is stored or changed. The tenant is then visible to the servicer through
:data:`current_tenant`: reservations, leases and request ids are bound to it.

Health checks stay open (probes carry no credentials; they reveal nothing). Every
other service (reflection) needs a known tenant. Methods not in :data:`RULES` are
refused, so a new RPC is closed until someone writes its rule.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from kvstore.config import Config
from kvstore.errors import ConfigError, KVStoreError, PermissionDenied, Unauthenticated
from kvstore.security.config import is_loopback
from kvstore.security.grants import Tenant, TenantTable

__all__ = ["RULES", "AuthInterceptor", "Rule", "ServerSecurity", "TenantRequestId",
           "current_tenant", "tenant_owner", "tenant_request_id"]

log = logging.getLogger(__name__)

#: The tenant of the call being served (``None``: the server runs without tenants).
current_tenant: contextvars.ContextVar[Tenant | None] = contextvars.ContextVar(
    "kvstore_tenant", default=None)

_SERVICE = "/kvstore.v1.KVStore/"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


@dataclass(frozen=True, slots=True)
class Rule:
    #: Right the call needs (``None``: any known tenant; ``"read|write"``: either).
    right: str | None
    #: The request's ``namespace`` must be in the grant (empty allowed if optional).
    namespace: bool = False
    namespace_optional: bool = False
    #: A shared-memory plane call (refused to tenants with ``shared_memory = false``).
    shm: bool = False


RULES: dict[str, Rule] = {
    "Lookup": Rule("read", namespace=True),
    "Get": Rule("read", namespace=True),
    "Acquire": Rule("read", namespace=True, shm=True),
    "Release": Rule("read", shm=True),  # leases are bound to their tenant
    "Segments": Rule("read|write", shm=True),  # not to an events-only router
    "Put": Rule("write", namespace=True),  # checked per message
    "Reserve": Rule("write", namespace=True, shm=True),
    "Commit": Rule("write", namespace=True, shm=True),
    "Abort": Rule("write", shm=True),  # reservations are bound to their tenant
    # Without a namespace a hint names a request id, which is the tenant's own.
    "Hint": Rule("write", namespace=True, namespace_optional=True),
    "Delete": Rule("write", namespace=True),  # Delete(ns, []) needs admin: see _check
    "Retain": Rule("write", namespace=True),
    "Stats": Rule("admin|read"),  # without admin: only what its namespaces hold
    "Profile": Rule("admin"),
    "SubscribeEvents": Rule("events"),
}


def _bearer(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


def _cert_names(context: Any) -> list[str]:
    try:
        auth = context.auth_context() or {}
    except Exception:  # noqa: BLE001 - no transport security on this call
        return []
    names: list[str] = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        names.extend(v.decode() if isinstance(v, bytes) else str(v) for v in auth.get(key, ()))
    return names


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, table: TenantTable) -> None:
        self.table = table

    def authenticate(self, metadata: Any, context: Any) -> Tenant:
        token = _bearer(metadata)
        if token is not None:
            tenant = self.table.by_token(token) if token else None
            if tenant is None:
                raise Unauthenticated("unknown bearer token")
            return tenant
        tenant = self.table.by_cert(_cert_names(context))
        if tenant is None:
            raise Unauthenticated(
                "no credential: send 'authorization: Bearer <token>' metadata (clients: "
                "KVSTORE_TOKEN) or a client certificate whose name a tenant lists")
        return tenant

    @staticmethod
    def check(tenant: Tenant, method: str, rule: Rule, request: Any) -> None:
        right = rule.right
        if method == "Delete" and not request.block_hashes:
            right = "admin"  # a whole namespace
        # A Lookup that holds what it finds hands out slots: a shared-memory call.
        shm = rule.shm or (method == "Lookup" and bool(getattr(request, "hold", False)))
        if shm and not tenant.shared_memory:
            raise PermissionDenied(
                f"tenant {tenant.name!r} may not use the shared-memory plane "
                "(shared_memory = false); use gRPC Put/Get")
        if right is not None and not tenant.rights.intersection(right.split("|")):
            what = "Delete of a whole namespace" if method == "Delete" and right == "admin" \
                else method
            raise PermissionDenied(f"tenant {tenant.name!r} lacks the {right!r} right "
                                   f"that {what} needs")
        if rule.namespace:
            ns = request.namespace
            if not ns and rule.namespace_optional:
                return
            if not tenant.covers(ns):
                raise PermissionDenied(
                    f"tenant {tenant.name!r} has no grant for namespace {ns[:200]!r}")

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(_OPEN_PREFIXES):
            return handler
        name = method[len(_SERVICE):] if method.startswith(_SERVICE) else None
        rule = RULES.get(name) if name else Rule(None)
        metadata = details.invocation_metadata
        return self._wrap(handler, name or method, rule, metadata)

    def _enter(self, method: str, rule: Rule | None, metadata: Any, context: Any,
               request: Any = None) -> Tenant:
        """Authenticate and authorize; then the call runs as the tenant. (Each RPC runs
        in its own task, whose context ends with it.)"""
        tenant = self.authenticate(metadata, context)
        if rule is None:
            raise PermissionDenied(f"{method}: no access rule; refused")
        if request is not None:
            self.check(tenant, method, rule, request)
        current_tenant.set(tenant)
        return tenant

    def _wrap(self, handler: Any, method: str, rule: Rule | None, metadata: Any) -> Any:
        inner_rule = rule
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                try:
                    self._enter(method, inner_rule, metadata, context, request)
                except KVStoreError as exc:
                    await _deny(context, method, exc)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                try:
                    self._enter(method, inner_rule, metadata, context, request)
                except KVStoreError as exc:
                    await _deny(context, method, exc)
                async for item in inner_us(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def stream_unary(requests: AsyncIterator[Any], context: Any) -> Any:
                try:
                    tenant = self._enter(method, inner_rule, metadata, context)
                except KVStoreError as exc:
                    await _deny(context, method, exc)
                checked_rule = inner_rule or Rule(None)  # (_enter refused None)

                async def checked() -> AsyncIterator[Any]:
                    async for req in requests:
                        # Raised inside the servicer's loop: it answers with the status,
                        # and this message is never stored.
                        self.check(tenant, method, checked_rule, req)
                        yield req

                return await inner_su(checked(), context)

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        inner_ss = handler.stream_stream  # (reflection)

        async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            try:
                self._enter(method, inner_rule, metadata, context)
            except KVStoreError as exc:
                await _deny(context, method, exc)
            async for item in inner_ss(requests, context):
                yield item

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


async def _deny(context: Any, method: str, exc: KVStoreError) -> NoReturn:
    log.info("refused %s from %s: %s", method, context.peer(), exc)
    context.set_trailing_metadata((("kvstore-error", type(exc).__name__),))
    await context.abort(getattr(grpc.StatusCode, exc.status), str(exc))
    raise exc  # (abort raises; should it ever return, the call still never runs)


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """What guards the port: the tenants (empty: none), TLS credentials (``None``:
    plaintext) and whether the transport itself authenticates (required client
    certificates)."""

    table: TenantTable
    credentials: grpc.ServerCredentials | None
    mutual_tls: bool
    allow_unauthenticated: bool

    @classmethod
    def from_config(cls, cfg: Config) -> ServerSecurity:
        table = cfg.auth.table()
        tls = cfg.tls
        if table.has_cert_names and not tls.client_ca_file:
            raise ConfigError(
                "auth.tenants: cert_names map client certificates to tenants, but no client "
                "certificate is ever checked; set tls.client_ca_file (and tls.cert_file / "
                "tls.key_file)")
        creds = None
        if tls.enabled:
            def read(path: str) -> bytes:
                with open(path, "rb") as f:
                    return f.read()

            creds = grpc.ssl_server_credentials(
                [(read(tls.key_file), read(tls.cert_file))],
                root_certificates=read(tls.client_ca_file) if tls.client_ca_file else None,
                require_client_auth=tls.require_client_cert)
        return cls(table, creds, tls.require_client_cert, cfg.auth.allow_unauthenticated)

    @property
    def authenticated(self) -> bool:
        return bool(self.table) or self.mutual_tls

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [AuthInterceptor(self.table)] if self.table else []

    def check_exposure(self, listen: str) -> None:
        """Refuse to serve a non-loopback address to anyone who connects."""
        if self.authenticated:
            if not self.table:
                log.warning("kvstore: every client whose certificate tls.client_ca_file "
                            "signs has every right (no [auth] tenants)")
            return
        if is_loopback(listen):
            log.warning("kvstore is UNAUTHENTICATED on %s: any local process may read, write "
                        "and delete every namespace. Configure [auth] tenants (bearer tokens) "
                        "or [tls] require_client_cert before exposing it.", listen)
            return
        if not self.allow_unauthenticated:
            raise ConfigError(
                f"server.listen: {listen!r} is not a loopback address and no authentication "
                "is configured; set [auth] tenants / tenants_file (bearer tokens) or [tls] "
                "require_client_cert = true (mutual TLS), or auth.allow_unauthenticated = true "
                "to serve it open anyway")
        log.warning("kvstore is UNAUTHENTICATED on non-loopback %s "
                    "(auth.allow_unauthenticated = true): anyone who reaches the port may "
                    "read, write and delete every namespace.", listen)

    def add_port(self, server: grpc.aio.Server, listen: str) -> int:
        if self.credentials is None:
            return int(server.add_insecure_port(listen))
        return int(server.add_secure_port(listen, self.credentials))


def tenant_owner(peer: str) -> str:
    """Who a reservation or lease belongs to: the tenant (if any) and its connection.

    Clients of one process can share a connection (gRPC pools subchannels), so the
    peer alone would let one tenant release or commit another's slots."""
    tenant = current_tenant.get()
    return f"{tenant.name}|{peer}" if tenant is not None else peer


@dataclass(frozen=True, slots=True)
class TenantRequestId:
    """A request id as one tenant named it (a key: no tenant's name and id can be
    taken for another's, whatever characters either holds)."""

    tenant: str
    request_id: str


def tenant_request_id(request_id: str) -> str | TenantRequestId:
    """Request ids are the tenant's own: another tenant's same id is another request.
    (The engine scopes them by namespace besides.) Empty: no request."""
    tenant = current_tenant.get()
    if tenant is None or not request_id:
        return request_id
    return TenantRequestId(tenant.name, request_id)

