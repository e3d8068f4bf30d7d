"""Bearer tokens and tenant scoping: one test per attack, each checking the status code
and that nothing stored changed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from kvstore import KVStoreClient
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from kvstore.client.aio import AsyncKVStoreClient
from kvstore.config import load_config
from kvstore.errors import ConfigError, PermissionDenied, Unauthenticated
from tests.blocks import make_chain
from tests.conftest import free_port
from tests.server.auth_helpers import (
    MTLS_TENANTS,
    TENANTS,
    TOKENS,
    code_of,
    header,
    metadata,
    stored,
)

NS_A = "a/model"
BLOCKS = make_chain(6, 4096, seed=1)
FRESH = make_chain(2, 4096, seed=2)  # never stored by anyone


@pytest.fixture
def authed(server_factory: Any) -> Any:
    srv = server_factory(auth={"tenants": TENANTS})
    with KVStoreClient(srv.address, token=TOKENS["a"]) as c:
        assert c.put(NS_A, BLOCKS) == len(BLOCKS)
    return srv


@pytest.fixture
def stub(authed: Any) -> Iterator[Any]:
    with grpc.insecure_channel(authed.address) as ch:
        yield pb_grpc.KVStoreStub(ch)


HASHES = [bytes(b.block_hash) for b in BLOCKS]
Call = Callable[[Any, list[tuple[str, str]], str], Any]

#: One call per RPC kind that names a namespace: (stub, metadata, namespace) -> result.
NAMESPACED: dict[str, Call] = {
    "lookup": lambda s, md, ns: s.Lookup(pb.LookupRequest(namespace=ns, block_hashes=HASHES),
                                         metadata=md),
    "get": lambda s, md, ns: list(s.Get(pb.GetRequest(namespace=ns, block_hashes=HASHES),
                                        metadata=md)),
    "put": lambda s, md, ns: s.Put(iter([pb.PutRequest(namespace=ns, blocks=[
        pb.Block(header=header(b), payload=b.payload) for b in FRESH])]), metadata=md),
    "delete": lambda s, md, ns: s.Delete(pb.DeleteRequest(namespace=ns,
                                                          block_hashes=HASHES[:2]), metadata=md),
    "delete_all": lambda s, md, ns: s.Delete(pb.DeleteRequest(namespace=ns), metadata=md),
    "reserve": lambda s, md, ns: s.Reserve(pb.ReserveRequest(
        namespace=ns, sizes=[4096], block_hashes=[bytes(FRESH[0].block_hash)]), metadata=md),
    "commit": lambda s, md, ns: s.Commit(pb.CommitRequest(
        namespace=ns, slots=[pb.SlotDescriptor(slot_id=1)], headers=[header(FRESH[0])]),
        metadata=md),
    "acquire": lambda s, md, ns: s.Acquire(pb.AcquireRequest(namespace=ns, block_hashes=HASHES),
                                           metadata=md),
    "hint": lambda s, md, ns: s.Hint(pb.HintRequest(namespace=ns, session_id="s",
                                                    event="session_end"), metadata=md),
    "retain": lambda s, md, ns: s.Retain(pb.RetainRequest(namespace=ns, block_hashes=HASHES,
                                                          ttl_s=60), metadata=md),
}
#: The rest: calls that name no namespace.
GLOBAL: dict[str, Call] = {
    "segments": lambda s, md, ns: s.Segments(pb.SegmentsRequest(), metadata=md),
    "abort": lambda s, md, ns: s.Abort(pb.AbortRequest(slot_ids=[1]), metadata=md),
    "release": lambda s, md, ns: s.Release(pb.ReleaseRequest(lease_id=1), metadata=md),
    "stats": lambda s, md, ns: s.Stats(pb.StatsRequest(), metadata=md),
    "profile": lambda s, md, ns: s.Profile(pb.ProfileRequest(), metadata=md),
    "subscribe_events": lambda s, md, ns: next(iter(s.SubscribeEvents(
        pb.SubscribeRequest(start_seq=0), metadata=md, timeout=10))),
}
EVERY = {**NAMESPACED, **GLOBAL}


def _refused(call: Call, stub: Any, md: list[tuple[str, str]], ns: str = NS_A
             ) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(stub, md, ns)
    return code_of(info.value)


@pytest.mark.parametrize("rpc", sorted(EVERY))
def test_no_token_is_unauthenticated(authed: Any, stub: Any, rpc: str) -> None:
    before = stored(authed)
    assert _refused(EVERY[rpc], stub, []) == grpc.StatusCode.UNAUTHENTICATED
    assert stored(authed) == before


@pytest.mark.parametrize("rpc", sorted(EVERY))
def test_wrong_token_is_unauthenticated(authed: Any, stub: Any, rpc: str) -> None:
    before = stored(authed)
    md = [("authorization", "Bearer token-a-but-not-quite")]
    assert _refused(EVERY[rpc], stub, md) == grpc.StatusCode.UNAUTHENTICATED
    assert _refused(EVERY[rpc], stub, [("authorization", "Basic dG9rZW4tYQ==")]) \
        == grpc.StatusCode.UNAUTHENTICATED
    assert stored(authed) == before


@pytest.mark.parametrize("rpc", sorted(NAMESPACED))
def test_token_of_b_cannot_touch_namespace_of_a(authed: Any, stub: Any, rpc: str) -> None:
    before = stored(authed)
    assert _refused(NAMESPACED[rpc], stub, metadata("b")) == grpc.StatusCode.PERMISSION_DENIED
    # A namespace that merely starts like a grant's prefix is outside it too.
    assert _refused(NAMESPACED[rpc], stub, metadata("a"), "b/a/model") \
        == grpc.StatusCode.PERMISSION_DENIED
    assert stored(authed) == before
    with KVStoreClient(authed.address, token=TOKENS["a"]) as c:
        assert [b.payload if b else None for b in c.get(NS_A, HASHES)] == \
            [b.payload for b in BLOCKS]


def test_put_stream_refused_at_the_first_foreign_message(authed: Any, stub: Any) -> None:
    """A stream that starts in its own namespace and then writes another's: the foreign
    message is refused before it is stored."""
    before = stored(authed)
    own = make_chain(2, 4096, seed=7)
    msgs = [pb.PutRequest(namespace="b/x", blocks=[pb.Block(header=header(b), payload=b.payload)
                                                   for b in own]),
            pb.PutRequest(namespace=NS_A, blocks=[pb.Block(header=header(b), payload=b.payload)
                                                  for b in FRESH])]
    with pytest.raises(grpc.RpcError) as info:
        stub.Put(iter(msgs), metadata=metadata("b"))
    assert code_of(info.value) == grpc.StatusCode.PERMISSION_DENIED
    after = stored(authed)
    assert {k for k in after if k[0] == NS_A} == {k for k in before if k[0] == NS_A}


def test_delete_of_a_whole_namespace_needs_admin(authed: Any, stub: Any) -> None:
    before = stored(authed)
    with KVStoreClient(authed.address, token=TOKENS["a"]) as c:
        with pytest.raises(PermissionDenied, match="admin"):
            c.delete(NS_A)
        assert stored(authed) == before
        assert c.delete(NS_A, HASHES[-1:]) == 1  # its own blocks, one by one: allowed
    with KVStoreClient(authed.address, token=TOKENS["admin"]) as c:
        assert c.delete(NS_A) == len(BLOCKS) - 1
    assert not [k for k in stored(authed) if k[0] == NS_A]


def test_read_only_tenant_cannot_write(authed: Any, stub: Any) -> None:
    before = stored(authed)
    for rpc in ("put", "delete", "reserve", "commit", "hint", "retain"):
        assert _refused(NAMESPACED[rpc], stub, metadata("reader")) \
            == grpc.StatusCode.PERMISSION_DENIED, rpc
    with KVStoreClient(authed.address, token=TOKENS["reader"]) as c:
        assert c.lookup(NS_A, HASHES).num_hit == len(BLOCKS)
        assert all(b is not None for b in c.get(NS_A, HASHES))
    assert stored(authed) == before


def test_events_stats_profile_need_their_rights(authed: Any, stub: Any) -> None:
    before = stored(authed)
    for rpc in ("subscribe_events", "profile"):
        assert _refused(GLOBAL[rpc], stub, metadata("a")) == grpc.StatusCode.PERMISSION_DENIED
    for rpc in ("stats", "segments"):  # an events-only router learns no segment names
        assert _refused(GLOBAL[rpc], stub, metadata("router")) \
            == grpc.StatusCode.PERMISSION_DENIED
    batch = GLOBAL["subscribe_events"](stub, metadata("router"), "")
    assert batch.payload
    assert GLOBAL["stats"](stub, metadata("admin"), "").blocks == len(BLOCKS)
    assert stored(authed) == before


def test_health_stays_open(authed: Any) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(authed.address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_client_errors_are_ours(authed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSTORE_TOKEN", raising=False)
    with KVStoreClient(authed.address, shared_memory=False) as c, \
            pytest.raises(Unauthenticated, match="no credential"):
        c.lookup(NS_A, HASHES)
    monkeypatch.setenv("KVSTORE_TOKEN", TOKENS["b"])
    with KVStoreClient(authed.address) as c:
        with pytest.raises(PermissionDenied, match="namespace 'a/model'"):
            c.get(NS_A, HASHES)
        assert c.put("b/model", FRESH) == 2  # its own namespace: fine, token from env


def test_aio_client_sends_the_token(authed: Any) -> None:
    async def run() -> None:
        async with AsyncKVStoreClient(authed.address, token=TOKENS["a"]) as c:
            got = await c.get(NS_A, HASHES)
            assert [b.payload for b in got if b] == [b.payload for b in BLOCKS]
            with pytest.raises(PermissionDenied):
                await c.get("b/model", HASHES)
        async with AsyncKVStoreClient(authed.address, token="nope") as c:
            with pytest.raises(Unauthenticated):
                await c.lookup(NS_A, HASHES)

    asyncio.run(run())


# -- the shared-memory plane ------------------------------------------------------------

def test_b_cannot_acquire_or_read_blocks_of_a_through_shared_memory(authed: Any) -> None:
    with KVStoreClient(authed.address, token=TOKENS["b"], shared_memory=True) as c:
        assert c.uses_shared_memory  # B may use the plane, for its own namespaces
        with pytest.raises(PermissionDenied):
            c.get(NS_A, HASHES)
        with pytest.raises(PermissionDenied):
            c.get_into(NS_A, HASHES[:1], [bytearray(4096)])
        with pytest.raises(PermissionDenied):
            c.lookup(NS_A, HASHES)


def test_leases_and_reservations_are_bound_to_their_tenant(authed: Any, stub: Any) -> None:
    """A and B on one connection (one process, pooled subchannel): the same peer, so only
    the tenant tells their leases and reservations apart."""
    before = stored(authed)
    lease = stub.Acquire(pb.AcquireRequest(namespace=NS_A, block_hashes=HASHES),
                         metadata=metadata("a"))
    assert lease.lease_id and all(s.length for s in lease.slots)
    for call in (lambda: stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id,
                                                        corrupt_hashes=HASHES),
                                      metadata=metadata("b")),):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert code_of(info.value) == grpc.StatusCode.PERMISSION_DENIED
    resv = stub.Reserve(pb.ReserveRequest(namespace=NS_A, sizes=[4096],
                                          block_hashes=[bytes(FRESH[0].block_hash)]),
                        metadata=metadata("a"))
    slot = resv.slots[0]
    assert slot.length == 4096
    attacks = [
        lambda: stub.Abort(pb.AbortRequest(slot_ids=[slot.slot_id]), metadata=metadata("b")),
        lambda: stub.Commit(pb.CommitRequest(namespace="b/x", slots=[slot],
                                             headers=[header(FRESH[0])]),
                            metadata=metadata("b")),
        lambda: stub.Commit(pb.CommitRequest(namespace=NS_A, slots=[slot],
                                             headers=[header(FRESH[0])]),
                            metadata=metadata("b")),
    ]
    for attack in attacks:
        with pytest.raises(grpc.RpcError) as info:
            attack()
        assert code_of(info.value) == grpc.StatusCode.PERMISSION_DENIED
    assert stored(authed) == before  # B's corrupt report dropped nothing either
    # A's own lease and reservation are intact.
    stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), metadata=metadata("a"))
    stub.Abort(pb.AbortRequest(slot_ids=[slot.slot_id]), metadata=metadata("a"))


def test_request_ids_are_per_tenant(authed: Any, stub: Any) -> None:
    """Another tenant naming A's request id, in A's own namespace, reaches no request
    of A's (request ids are scoped by tenant as well as by namespace)."""
    stub.Lookup(pb.LookupRequest(namespace=NS_A, block_hashes=HASHES, request_id="r1",
                                 session_id="sa"), metadata=metadata("a"))
    with pytest.raises(grpc.RpcError) as info:
        stub.Hint(pb.HintRequest(namespace=NS_A, request_id="r1", event="session_end"),
                  metadata=metadata("admin"))
    assert code_of(info.value) == grpc.StatusCode.INVALID_ARGUMENT  # unknown request to it
    assert stub.Hint(pb.HintRequest(namespace=NS_A, request_id="r1", event="turn_end"),
                     metadata=metadata("a")) is not None


def test_tenant_without_shared_memory_uses_grpc(authed: Any, stub: Any) -> None:
    for rpc in ("segments",):
        assert _refused(GLOBAL[rpc], stub, metadata("noshm")) \
            == grpc.StatusCode.PERMISSION_DENIED
    blocks = make_chain(3, 4096, seed=5)
    with KVStoreClient(authed.address, token=TOKENS["noshm"]) as c:
        assert not c.uses_shared_memory
        assert c.put("c/m", blocks) == 3
        assert [b.payload if b else None for b in c.get("c/m", [b.block_hash for b in blocks])] \
            == [b.payload for b in blocks]
    # A lookup may not hand it slots either (a hold), only the plain answer.
    hashes = [b.block_hash for b in blocks]
    with pytest.raises(grpc.RpcError) as info:
        stub.Lookup(pb.LookupRequest(namespace="c/m", block_hashes=hashes, hold=True),
                    metadata=metadata("noshm"))
    assert code_of(info.value) == grpc.StatusCode.PERMISSION_DENIED
    assert "shared-memory plane" in (info.value.details() or "")
    assert stub.Lookup(pb.LookupRequest(namespace="c/m", block_hashes=hashes),
                       metadata=metadata("noshm")).num_hit == 3


# -- exposure and config ----------------------------------------------------------------

def test_open_loopback_server_warns(server_factory: Any, caplog: pytest.LogCaptureFixture
                                    ) -> None:
    with caplog.at_level(logging.WARNING, logger="kvstore.security.server"):
        server_factory()
    assert "UNAUTHENTICATED" in caplog.text


EVENTS = {"endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*"}


def test_non_loopback_without_auth_refused(tmp_path: Any) -> None:
    from kvstore.server.app import KVStoreServer

    cfg = load_config(env={}, overrides={
        "data_dir": str(tmp_path), "server": {"listen": f"0.0.0.0:{free_port()}",
                                              "metrics_port": 0},
        "dram": {"capacity": "16MiB"}, "disk": {"enabled": False}, "events": EVENTS})
    with pytest.raises(ConfigError, match="allow_unauthenticated"):
        asyncio.run(KVStoreServer(cfg).start())
    cfg = load_config(env={"KVSTORE_AUTH__ALLOW_UNAUTHENTICATED": "true"}, overrides={
        "data_dir": str(tmp_path), "server": {"listen": f"0.0.0.0:{free_port()}",
                                              "metrics_port": 0},
        "dram": {"capacity": "16MiB"}, "disk": {"enabled": False}, "events": EVENTS})

    async def start_stop() -> None:
        srv = KVStoreServer(cfg)
        try:
            await srv.start()
            assert srv.port
        finally:
            await srv.stop(0)

    asyncio.run(start_stop())


@pytest.mark.parametrize(("tenants", "message"), [
    ([{"name": "x", "token": "t", "namespaces": ["a/*"], "rights": ["root"]}],
     r"auth.tenants\[0\].rights: unknown right 'root'"),
    ([{"name": "x", "token": "t", "namespaces": ["a/*"], "rihgts": ["read"]}],
     r"auth.tenants\[0\].rihgts: unknown key"),
    ([{"name": "x", "namespaces": ["a/*"]}], r"auth.tenants\[0\]: tenant 'x' has no credential"),
    ([{"name": "x", "token": "t"}], r"auth.tenants\[0\].namespaces"),
    ([{"name": "x", "token": "t", "namespaces": ["a*b"]}], r"may only end a prefix"),
    ([{"name": "x", "token": "t", "namespaces": ["a"]},
      {"name": "y", "token": "t", "namespaces": ["b"]}], r"share a token"),
    ([{"name": "x", "token_env": "KVSTORE_TEST_UNSET", "namespaces": ["a"]}],
     r"auth.tenants\[0\].token_env: environment variable KVSTORE_TEST_UNSET is not set"),
])
def test_bad_auth_config_names_the_key(tmp_path: Any, tenants: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, overrides={"data_dir": str(tmp_path), "auth": {"tenants": tenants}})


def test_tenants_file_and_token_env(server_factory: Any, tmp_path: Any,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    monkeypatch.setenv("KVSTORE_TEST_TOKEN_X", "from-env")
    path = tmp_path / "tenants.toml"
    digest = hashlib.sha256(b"hashed-token").hexdigest()
    path.write_text(f'[[tenants]]\nname = "x"\ntoken_env = "KVSTORE_TEST_TOKEN_X"\n'
                    f'namespaces = ["x/*"]\n\n[[tenants]]\nname = "y"\n'
                    f'token_sha256 = "{digest}"\nnamespaces = ["y"]\nrights = ["read"]\n')
    srv = server_factory(auth={"tenants_file": str(path)})
    with KVStoreClient(srv.address, token="from-env") as c:
        assert c.put("x/1", FRESH) == 2
    with KVStoreClient(srv.address, token="hashed-token") as c:
        assert c.lookup("y", HASHES).num_hit == 0
        with pytest.raises(PermissionDenied):
            c.put("y", FRESH)
    with pytest.raises(ConfigError, match="auth.tenants_file: cannot read"):
        load_config(env={}, overrides={"auth": {"tenants_file": str(tmp_path / "missing")}})


def test_vllm_connector_config_carries_the_credentials(authed: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors.vllm.config import ConnectorConfig

    monkeypatch.setenv("KVSTORE_TOKEN", TOKENS["b"])
    assert ConnectorConfig.from_extra_config({}).security().token == TOKENS["b"]
    cfg = ConnectorConfig.from_extra_config({"address": authed.address, "token": TOKENS["a"]})
    with cfg.client_factory()(authed.address, 5.0) as c:
        assert c.lookup(NS_A, HASHES).num_hit == len(BLOCKS)
    with pytest.raises(ConfigError, match="tls_cert_file|cert_file"):
        ConnectorConfig.from_extra_config({"tls_cert_file": "/nonexistent.crt"})


def test_every_rpc_has_a_rule() -> None:
    """A new RPC is refused until it gets a rule; this names the ones missing one."""
    from kvstore.security.server import RULES

    methods = set(pb.DESCRIPTOR.services_by_name["KVStore"].methods_by_name)
    assert methods == set(RULES)


def test_reflection_needs_a_tenant(authed: Any) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(authed.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ServerReflectionInfo(iter([req]), timeout=5))
        assert code_of(info.value) == grpc.StatusCode.UNAUTHENTICATED
        got = list(stub.ServerReflectionInfo(iter([req]), metadata=metadata("a"), timeout=5))
        assert got[0].list_services_response.service


def test_aio_put_stream_sends_the_token(authed: Any) -> None:
    blocks = make_chain(3, 4096, seed=9)

    async def run() -> None:
        async with AsyncKVStoreClient(authed.address, token=TOKENS["a"],
                                      shared_memory=False) as c:
            assert await c.put("a/aio", blocks) == 3
            with pytest.raises(PermissionDenied):
                await c.put("b/aio", blocks)

    before = stored(authed)
    asyncio.run(run())
    after = stored(authed)
    assert {k for k in after if k not in before} == {("a/aio", bytes(b.block_hash))
                                                      for b in blocks}


def test_cert_names_without_a_client_ca_refused(tmp_path: Any) -> None:
    from kvstore.security.server import ServerSecurity

    cfg = load_config(env={}, overrides={"data_dir": str(tmp_path),
                                         "auth": {"tenants": MTLS_TENANTS}})
    with pytest.raises(ConfigError, match="tls.client_ca_file"):
        ServerSecurity.from_config(cfg)


def test_stats_without_admin_count_only_the_tenants_namespaces(authed: Any) -> None:
    with KVStoreClient(authed.address, token=TOKENS["b"]) as c:
        c.put("b/model", FRESH)
        mine = c.stats()
    assert (mine.blocks, mine.namespaces) == (len(FRESH), 1)
    assert mine.lookups == mine.puts == mine.bytes_in == mine.events_published == 0
    assert sum(t.used_bytes for t in mine.tiers) >= sum(len(b.payload) for b in FRESH)
    with KVStoreClient(authed.address, token=TOKENS["a"]) as c:
        assert (c.stats().blocks, c.stats().namespaces) == (len(BLOCKS), 1)
    with KVStoreClient(authed.address, token=TOKENS["admin"]) as c:
        everything = c.stats()
    assert (everything.blocks, everything.namespaces) == (len(BLOCKS) + len(FRESH), 2)
    assert everything.puts > 0


def test_a_tenant_sees_its_own_quotas_and_no_one_elses(server_factory: Any) -> None:
    srv = server_factory(auth={"tenants": TENANTS},
                         quotas=[{"namespace_prefix": "a/", "dram": "64MiB"},
                                 {"namespace_prefix": "b/", "dram": "32MiB"}])
    with KVStoreClient(srv.address, token=TOKENS["a"]) as c:
        assert c.put(NS_A, BLOCKS) == len(BLOCKS)
        mine = c.stats()
    assert [(q.namespace_prefix, q.tier, q.limit_bytes) for q in mine.quotas] == [
        ("a/", "dram", 64 << 20)]
    assert mine.quotas[0].used_bytes >= sum(len(b.payload) for b in BLOCKS)
    with KVStoreClient(srv.address, token=TOKENS["b"]) as c:
        theirs = c.stats()
    assert [(q.namespace_prefix, q.used_bytes) for q in theirs.quotas] == [("b/", 0)]
    with KVStoreClient(srv.address, token=TOKENS["admin"]) as c:
        assert sorted(q.namespace_prefix for q in c.stats().quotas) == ["a/", "b/"]
