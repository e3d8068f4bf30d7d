"""Tenants and what each may do: the rights table tokens and client certificates map to.

A tenant is a name, the credentials that prove it (bearer tokens, client-certificate
names) and a grant: namespaces (exact, or a prefix ending in ``*``; ``"*"`` is every
namespace) and rights:

- ``read``: Lookup, Get, Acquire (and Release of its own leases); Stats of what its
  namespaces hold;
- ``write``: Put, Reserve / Commit / Abort (its own reservations), Hint, Retain, Delete
  of listed blocks;
- ``admin``: Delete of a whole namespace (``Delete(ns, [])``) inside the grant, the
  whole server's Stats, Profile (they aggregate every namespace: the operator's);
- ``events``: SubscribeEvents. The stream is vLLM's wire format, which names no
  namespace, so it carries every namespace's block hashes: give it to routers.

``shared_memory = false`` keeps a tenant off the shared-memory plane (Segments,
Reserve, Commit, Abort, Acquire, Release, and a Lookup that holds what it finds): the
plane is one segment per tier, and a process that maps it can read every slot in it,
whoever stored them. Tenants that share a host with others they do not trust use gRPC
streaming only.

Pure: no I/O besides reading the token environment variables a table names.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.errors import ConfigError

__all__ = ["RIGHTS", "Tenant", "TenantTable", "parse_tenants", "token_digest"]

RIGHTS = ("read", "write", "admin", "events")
_KEYS = ("name", "token", "token_sha256", "token_env", "cert_names", "namespaces", "rights",
         "shared_memory")


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    #: Exact namespaces, or prefixes ending in ``*`` (``"*"``: every namespace).
    namespaces: tuple[str, ...]
    rights: frozenset[str]
    shared_memory: bool = True

    def covers_prefix(self, prefix: str) -> bool:
        """Whether every namespace starting with ``prefix`` is this tenant's (a quota
        on ``prefix`` is then its own to see)."""
        return any(p.endswith("*") and prefix.startswith(p[:-1]) for p in self.namespaces)

    def covers(self, namespace: str) -> bool:
        for pattern in self.namespaces:
            if pattern.endswith("*"):
                if namespace.startswith(pattern[:-1]):
                    return True
            elif namespace == pattern:
                return True
        return False

    def may(self, right: str, namespace: str | None = None) -> bool:
        """``right`` on ``namespace`` (``None``: a call that names no namespace)."""
        if right not in self.rights:
            return False
        return namespace is None or self.covers(namespace)


class TenantTable:
    """Tenants by token (SHA-256 digests, compared in constant time) and by the names
    of their client certificates (CN or SAN)."""

    def __init__(self, entries: Iterable[tuple[Tenant, Sequence[bytes], Sequence[str]]] = ()
                 ) -> None:
        self._tokens: list[tuple[bytes, Tenant]] = []
        self._certs: dict[str, Tenant] = {}
        self.tenants: list[Tenant] = []
        for tenant, digests, cert_names in entries:
            self.tenants.append(tenant)
            self._tokens.extend((d, tenant) for d in digests)
            for cn in cert_names:
                self._certs[cn] = tenant

    def __bool__(self) -> bool:
        return bool(self.tenants)

    @property
    def has_cert_names(self) -> bool:
        return bool(self._certs)

    def by_token(self, token: str) -> Tenant | None:
        digest = token_digest(token)
        found = None
        for known, tenant in self._tokens:  # every entry compared: no timing hint
            if hmac.compare_digest(known, digest):
                found = tenant
        return found

    def by_cert(self, names: Iterable[str]) -> Tenant | None:
        for name in names:
            tenant = self._certs.get(name)
            if tenant is not None:
                return tenant
        return None


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{what}: expected a list of non-empty strings, got {value!r}")
    return tuple(value)


def _one(raw: Any, what: str, env: Mapping[str, str]
         ) -> tuple[Tenant, list[bytes], tuple[str, ...]]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{what}: expected a table, got {raw!r}")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{what}.{unknown[0]}: unknown key; valid: {', '.join(_KEYS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what}.name: expected a non-empty string, got {name!r}")
    digests: list[bytes] = []
    for token in _strings(raw.get("token", []), f"{what}.token"):
        digests.append(token_digest(token))
    for hexed in _strings(raw.get("token_sha256", []), f"{what}.token_sha256"):
        try:
            d = bytes.fromhex(hexed)
        except ValueError:
            d = b""
        if len(d) != 32:
            raise ConfigError(f"{what}.token_sha256: expected 64 hex digits, got {hexed!r}")
        digests.append(d)
    for var in _strings(raw.get("token_env", []), f"{what}.token_env"):
        if not env.get(var):
            raise ConfigError(f"{what}.token_env: environment variable {var} is not set")
        digests.append(token_digest(env[var]))
    certs = _strings(raw.get("cert_names", []), f"{what}.cert_names")
    if not digests and not certs:
        raise ConfigError(
            f"{what}: tenant {name!r} has no credential; give token, token_sha256, token_env "
            "or cert_names")
    namespaces = _strings(raw.get("namespaces", []), f"{what}.namespaces")
    if not namespaces:
        raise ConfigError(f"{what}.namespaces: tenant {name!r} needs at least one namespace "
                          "(exact, a prefix ending in '*', or '*' for all)")
    for ns in namespaces:
        if "*" in ns[:-1]:
            raise ConfigError(f"{what}.namespaces: '*' may only end a prefix, got {ns!r}")
    rights = _strings(raw.get("rights", ["read", "write"]), f"{what}.rights")
    bad = [r for r in rights if r not in RIGHTS]
    if bad:
        raise ConfigError(f"{what}.rights: unknown right {bad[0]!r}; valid: {', '.join(RIGHTS)}")
    shm = raw.get("shared_memory", True)
    if not isinstance(shm, bool):
        raise ConfigError(f"{what}.shared_memory: expected true or false, got {shm!r}")
    return Tenant(name, namespaces, frozenset(rights), shm), digests, certs


def parse_tenants(raw: Any, what: str = "auth.tenants",
                  env: Mapping[str, str] | None = None) -> TenantTable:
    """``[{name, token | token_sha256 | token_env | cert_names, namespaces, rights}, ...]``;
    errors name the entry and key (``auth.tenants[1].rights``)."""
    if not isinstance(raw, list | tuple):
        raise ConfigError(f"{what}: expected a list of tables, got {raw!r}")
    env = os.environ if env is None else env
    entries = [_one(item, f"{what}[{i}]", env) for i, item in enumerate(raw)]
    names = [t.name for t, _, _ in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{what}: tenant {dup[0]!r} appears twice")
    seen: dict[bytes, str] = {}
    for tenant, digests, _ in entries:
        for d in digests:
            if d in seen and seen[d] != tenant.name:
                raise ConfigError(
                    f"{what}: tenants {seen[d]!r} and {tenant.name!r} share a token")
            seen[d] = tenant.name
    certs: dict[str, str] = {}
    for tenant, _, cns in entries:
        for cn in cns:
            if cn in certs:
                raise ConfigError(
                    f"{what}: certificate name {cn!r} maps to both {certs[cn]!r} and "
                    f"{tenant.name!r}")
            certs[cn] = tenant.name
    return TenantTable(entries)
