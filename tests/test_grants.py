"""The rights table on its own: namespace patterns, rights, credentials (no server)."""

from __future__ import annotations

import pytest

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.errors import PermissionDenied
from kvstore.security.config import is_loopback
from kvstore.security.grants import Tenant, parse_tenants
from kvstore.security.server import RULES, AuthInterceptor


@pytest.mark.parametrize(("patterns", "namespace", "covered"), [
    (("a/*",), "a/x", True),
    (("a/*",), "a/", True),
    (("a/*",), "a", False),
    (("a/*",), "ab/x", False),
    (("a/*",), "b/a/x", False),
    (("a",), "a", True),
    (("a",), "a/x", False),
    (("*",), "", True),
    (("*",), "anything/at/all", True),
    (("x", "a/*"), "a/y", True),
])
def test_namespace_patterns(patterns: tuple[str, ...], namespace: str, covered: bool) -> None:
    assert Tenant("t", patterns, frozenset({"read"})).covers(namespace) is covered


def test_tokens_and_certificates_find_their_tenant() -> None:
    table = parse_tenants([
        {"name": "a", "token": ["t1", "t2"], "namespaces": ["a"], "cert_names": ["cn-a"]},
        {"name": "b", "token": "t3", "namespaces": ["b"], "rights": ["read"]},
    ], env={})
    assert [table.by_token(t).name for t in ("t1", "t2", "t3")] == ["a", "a", "b"]  # type: ignore[union-attr]
    assert table.by_token("t4") is None and table.by_token("") is None
    assert table.by_cert(["other", "cn-a"]).name == "a"  # type: ignore[union-attr]
    assert table.by_cert(["cn-b"]) is None


@pytest.mark.parametrize(("method", "request_", "rights", "allowed"), [
    ("Delete", pb.DeleteRequest(namespace="a", block_hashes=[b"x" * 32]), {"write"}, True),
    ("Delete", pb.DeleteRequest(namespace="a"), {"write"}, False),
    ("Delete", pb.DeleteRequest(namespace="a"), {"admin"}, True),
    ("Hint", pb.HintRequest(request_id="r"), {"write"}, True),
    ("Hint", pb.HintRequest(namespace="b", session_id="s"), {"write"}, False),
    ("Lookup", pb.LookupRequest(namespace="a"), {"write"}, False),
    ("Segments", pb.SegmentsRequest(), {"events"}, False),
    ("Segments", pb.SegmentsRequest(), {"read"}, True),
    ("Stats", pb.StatsRequest(), {"read"}, True),
    ("Profile", pb.ProfileRequest(), {"read", "write"}, False),
    ("SubscribeEvents", pb.SubscribeRequest(), {"read", "write", "admin"}, False),
])
def test_rules(method: str, request_: object, rights: set[str], allowed: bool) -> None:
    tenant = Tenant("t", ("a",), frozenset(rights))
    if allowed:
        AuthInterceptor.check(tenant, method, RULES[method], request_)
    else:
        with pytest.raises(PermissionDenied):
            AuthInterceptor.check(tenant, method, RULES[method], request_)


def test_no_shared_memory_tenant_is_kept_off_the_plane() -> None:
    tenant = Tenant("t", ("a",), frozenset({"read", "write"}), shared_memory=False)
    for method in ("Segments", "Reserve", "Commit", "Abort", "Acquire", "Release"):
        with pytest.raises(PermissionDenied, match="shared-memory"):
            AuthInterceptor.check(tenant, method, RULES[method], pb.AcquireRequest(namespace="a"))


@pytest.mark.parametrize(("listen", "loopback"), [
    ("127.0.0.1:1", True), ("127.9.9.9:1", True), ("[::1]:1", True), ("localhost:1", True),
    ("0.0.0.0:1", False), ("[::]:1", False), ("10.0.0.5:1", False), ("kvstore:1", False),
])
def test_loopback(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback
