"""Property-based fuzzing of every RPC over a real in-process server.

Each test sends random and malformed messages (bad hash lengths, empty and huge
namespaces, mismatched lists, forged descriptors, NaN / inf / negative numbers,
unknown events and workloads, duplicate hashes, token lists far past the limit)
and checks that the server answers OK or a documented status (INVALID_ARGUMENT,
NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED, RESOURCE_EXHAUSTED), never
UNKNOWN or INTERNAL, always with a message, and that the blocks stored before
are still all there with the same bytes.

``KVSTORE_FUZZ_EXAMPLES=N`` runs N random examples per test (default: a fixed,
derandomized set small enough for CI).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from kvstore.policies import Hint

from kvstore import KVStoreClient
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from tests.blocks import make_chain
from tests.conftest import ServerThread, test_config
from tests.fuzzing import FUZZ, FUZZ_FEW

MiB = 2**20
KEEP_NS = "keep"
KEEP_SESSION = "keeper"

OK = grpc.StatusCode.OK
DOCUMENTED = {
    OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: Any) -> Iterator[ServerThread]:
    cfg = test_config(tmp_path_factory.mktemp("fuzz"), dram={"capacity": "32MiB"},
                      disk={"capacity": "256MiB"},
                      server={"max_hashes_per_call": 2048, "max_block_tokens": 1024,
                              "max_block_bytes": 4 * MiB, "max_message_bytes": 64 * MiB,
                              "lease_seconds": 10})
    srv = ServerThread(cfg)
    yield srv
    srv.stop()


class Kept(list[Any]):
    """The blocks stored before the fuzzing (a short repr: hypothesis prints arguments)."""

    def __repr__(self) -> str:
        return f"<{len(self)} kept blocks>"


@pytest.fixture(scope="module")
def kept(fuzz_server: ServerThread) -> Kept:
    blocks = Kept(make_chain(6, 64 * 1024, seed=7))
    with KVStoreClient(fuzz_server.address) as c:
        assert c.put(KEEP_NS, blocks, session_id=KEEP_SESSION) == 6
    return blocks


@pytest.fixture(scope="module")
def stub(fuzz_server: ServerThread) -> Iterator[pb_grpc.KVStoreStub]:
    ch = grpc.insecure_channel(fuzz_server.address, options=[
        ("grpc.max_send_message_length", 64 * MiB),
        ("grpc.max_receive_message_length", 64 * MiB)])
    yield pb_grpc.KVStoreStub(ch)
    ch.close()


@pytest.fixture(autouse=True)
def nothing_stored_changes(fuzz_server: ServerThread, kept: list[Any]) -> Iterator[None]:
    """After each test: every kept block reads back with its bytes (both paths)."""
    yield
    hashes = [b.block_hash for b in kept]
    for shm in (True, False):
        with KVStoreClient(fuzz_server.address, shared_memory=shm) as c:
            got = c.get(KEEP_NS, hashes)
        assert [g.payload if g else None for g in got] == [b.payload for b in kept]


def call(what: str, fn: Callable[[], Any], kept: list[Any], stub: Any) -> tuple[Any, Any]:
    """Run one RPC: a documented status with a message, and the kept chain still
    fully stored. Returns (status, response or None)."""
    try:
        resp = fn()
        code, details = OK, ""
    except grpc.RpcError as exc:
        resp, code, details = None, exc.code(), exc.details()
    if currently_in_test_context():  # the mix of outcomes (--hypothesis-show-statistics)
        event(f"{what}: {code.name}")
    assert code in DOCUMENTED, f"{what}: {code.name}: {details}"
    assert code == OK or details, f"{what}: {code.name} without a message"
    hit = stub.Lookup(pb.LookupRequest(namespace=KEEP_NS,
                                       block_hashes=[b.block_hash for b in kept]))
    assert hit.num_hit == len(kept), f"{what} lost kept blocks"
    return code, resp


# -- strategies ------------------------------------------------------------------------
hashes_1 = st.one_of(st.binary(min_size=32, max_size=32), st.binary(min_size=16, max_size=16),
                     st.binary(min_size=8, max_size=8), st.binary(max_size=40))
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)
namespaces = st.one_of(st.just(""), text, st.integers(4096, 200_000).map(lambda n: "n" * n),
                       st.integers(900, 1024).map(lambda n: "\U0001f600" * n),
                       st.sampled_from(["ns-a", "ns-b", "m|bf16|tp0/1"])
                       ).filter(lambda s: s != KEEP_NS)
hash_lists = st.one_of(
    st.lists(hashes_1, max_size=8),
    st.builds(lambda h, n: [h] * n, st.binary(min_size=32, max_size=32), st.integers(2, 5)),
    st.integers(2049, 3000).map(lambda n: [i.to_bytes(32, "big") for i in range(n)]),
)
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -1.0, 1e300, -1e300, 1e-300, math.nan, math.inf,
                                     -math.inf, 0.5, 30.0]))
workloads = st.one_of(st.sampled_from(["", "chat", "agent", "batch", "gaming", "CHAT"]), text)
uint64 = st.integers(0, 2**64 - 1)
token_lists = st.one_of(
    st.lists(st.integers(-2**63, 2**63 - 1), max_size=40),
    st.integers(1025, 3_000_000).map(lambda n: list(range(n))),  # past max_block_tokens
)
payloads = st.one_of(st.binary(max_size=4096), st.integers(0, 5 * MiB).map(bytes))


@st.composite
def headers(draw: Any, block_hash: Any = hashes_1) -> pb.BlockHeader:
    return pb.BlockHeader(block_hash=draw(block_hash), parent_hash=draw(hashes_1),
                          token_ids=draw(st.one_of(st.lists(st.integers(0, 50_000),
                                                            max_size=16), token_lists)),
                          size=draw(uint64), checksum=draw(uint64), session_id=draw(text),
                          workload=draw(workloads))


# -- the RPCs -------------------------------------------------------------------------
@FUZZ
@given(ns=namespaces, hashes=hash_lists, session=text, workload=workloads)
def test_lookup(stub, kept, ns, hashes, session, workload):
    call("Lookup", lambda: stub.Lookup(pb.LookupRequest(
        namespace=ns, block_hashes=hashes, session_id=session, workload=workload)), kept, stub)


@FUZZ
@given(messages=st.lists(st.tuples(namespaces, st.lists(st.tuples(headers(), payloads),
                                                            max_size=3), text, workloads),
                         min_size=0, max_size=3))
def test_put(stub, kept, messages):
    reqs = [pb.PutRequest(namespace=ns, session_id=sid, workload=wl,
                          blocks=[pb.Block(header=h, payload=p) for h, p in blocks])
            for ns, blocks, sid, wl in messages]
    call("Put", lambda: stub.Put(iter(reqs)), kept, stub)


@FUZZ
@given(ns=st.one_of(namespaces, st.just(KEEP_NS)), hashes=hash_lists)
def test_get(stub, kept, ns, hashes):
    call("Get", lambda: list(stub.Get(pb.GetRequest(namespace=ns, block_hashes=hashes))),
         kept, stub)


@FUZZ
@given(ns=namespaces, sizes=st.lists(st.one_of(uint64, st.integers(0, 8 * MiB)), max_size=6),
       hashes=hash_lists, mutate=st.sampled_from(["none", "offset", "length", "segment",
                                                  "slot_id", "hash", "all"]),
       header=headers(), extra=st.integers(0, 2**63))
def test_reserve_commit_abort(stub, kept, ns, sizes, hashes, mutate, header, extra):
    code, resv = call("Reserve", lambda: stub.Reserve(pb.ReserveRequest(
        namespace=ns, sizes=sizes, block_hashes=hashes)), kept, stub)
    slots = [d for d in resv.slots if d.slot_id] if resv is not None else []
    forged = []
    for d in slots:
        f = pb.SlotDescriptor()
        f.CopyFrom(d)
        if mutate in ("offset", "all"):
            f.offset = (f.offset + extra) % 2**64
        if mutate in ("length", "all"):
            f.length = extra % 2**64
        if mutate in ("segment", "all"):
            f.segment = f"{f.segment}x"
        if mutate in ("slot_id", "all"):
            f.slot_id = extra or 1
        forged.append(f)
    hdrs = [header] * len(forged) if mutate == "hash" else [
        pb.BlockHeader(block_hash=d.block_hash, token_ids=header.token_ids,
                       parent_hash=header.parent_hash) for d in forged]
    call("Commit", lambda: stub.Commit(pb.CommitRequest(
        namespace=ns, slots=forged, headers=hdrs, session_id=header.session_id,
        workload=header.workload)), kept, stub)
    if slots:  # what was not committed goes back (errors: already committed)
        call("Abort", lambda: stub.Abort(pb.AbortRequest(slot_ids=[d.slot_id for d in slots])),
             kept, stub)


@FUZZ
@given(slots=st.lists(st.builds(pb.SlotDescriptor, segment=text, offset=uint64, length=uint64,
                                block_hash=hashes_1, checksum=uint64, slot_id=uint64),
                      max_size=4),
       headers=st.lists(headers(), max_size=4), ns=st.one_of(namespaces, st.just(KEEP_NS)),
       workload=workloads, ids=st.lists(uint64, max_size=6))
def test_commit_and_abort_of_forged_slots(stub, kept, slots, headers, ns, workload, ids):
    call("Commit", lambda: stub.Commit(pb.CommitRequest(
        namespace=ns, slots=slots, headers=headers, workload=workload)), kept, stub)
    call("Abort", lambda: stub.Abort(pb.AbortRequest(slot_ids=ids)), kept, stub)


@FUZZ
@given(ns=st.one_of(namespaces, st.just(KEEP_NS)), hashes=hash_lists, seconds=numbers,
       use_kept=st.booleans(), lease_id=uint64, report=st.lists(hashes_1, max_size=4),
       report_kept=st.booleans())
def test_acquire_release(stub, kept, ns, hashes, seconds, use_kept, lease_id, report,
                         report_kept):
    if use_kept:
        ns, hashes = KEEP_NS, [b.block_hash for b in kept[:3]] + hashes[:2]
    code, lease = call("Acquire", lambda: stub.Acquire(pb.AcquireRequest(
        namespace=ns, block_hashes=hashes, lease_seconds=seconds)), kept, stub)
    if report_kept:  # a false corruption report must not drop intact blocks
        report = report + [b.block_hash for b in kept]
    lid = lease.lease_id if lease is not None else lease_id
    call("Release", lambda: stub.Release(pb.ReleaseRequest(lease_id=lid,
                                                           corrupt_hashes=report)), kept, stub)
    if lease is not None and lid != lease_id:
        call("Release", lambda: stub.Release(pb.ReleaseRequest(lease_id=lease_id)), kept, stub)


@FUZZ
@given(ns=st.one_of(namespaces, st.just(KEEP_NS)), hashes=hash_lists)
def test_delete(stub, kept, ns, hashes):
    keep = {b.block_hash for b in kept}
    if ns == KEEP_NS:
        hashes = [h for h in hashes if h not in keep] or [b"\x00" * 32]
    call("Delete", lambda: stub.Delete(pb.DeleteRequest(namespace=ns, block_hashes=hashes)),
         kept, stub)


@FUZZ
@given(session=st.one_of(text, st.just("")).filter(lambda s: s != KEEP_SESSION),
       event=st.one_of(st.sampled_from(Hint.EVENTS), st.sampled_from(["", "lunch", "TURN_END"]),
                       text),
       workload=workloads, tool=st.one_of(text, st.integers(0, 100_000).map(lambda n: "t" * n)),
       gap=numbers, ns=namespaces)
def test_hint(stub, kept, session, event, workload, tool, gap, ns):
    call("Hint", lambda: stub.Hint(pb.HintRequest(
        session_id=session, event=event, workload=workload, tool=tool, expected_gap_ms=gap,
        namespace=ns)), kept, stub)


@FUZZ
@given(ns=namespaces, hashes=hash_lists, ttl=numbers)
def test_retain(stub, kept, ns, hashes, ttl):
    call("Retain", lambda: stub.Retain(pb.RetainRequest(namespace=ns, block_hashes=hashes,
                                                        ttl_s=ttl)), kept, stub)


@FUZZ_FEW
@given(start=st.integers(-2**63, 2**63 - 1))
def test_subscribe_events(stub, kept, start):
    def subscribe() -> None:
        stream = stub.SubscribeEvents(pb.SubscribeRequest(start_seq=start), timeout=0.2)
        try:
            for _ in stream:
                pass
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise

    call("SubscribeEvents", subscribe, kept, stub)


# -- what specific bad inputs must get -------------------------------------------------
bad_length = st.binary(max_size=40).filter(lambda h: len(h) not in (8, 16, 32))


@FUZZ
@given(h=bad_length, rpc=st.sampled_from(["Lookup", "Get", "Acquire", "Delete", "Reserve"]))
def test_a_hash_of_a_bad_length_is_invalid_everywhere(stub, kept, h, rpc):
    req = {"Lookup": lambda: stub.Lookup(pb.LookupRequest(namespace=KEEP_NS, block_hashes=[h])),
           "Get": lambda: list(stub.Get(pb.GetRequest(namespace=KEEP_NS, block_hashes=[h]))),
           "Acquire": lambda: stub.Acquire(pb.AcquireRequest(namespace=KEEP_NS,
                                                             block_hashes=[h])),
           "Delete": lambda: stub.Delete(pb.DeleteRequest(namespace=KEEP_NS, block_hashes=[h])),
           "Reserve": lambda: stub.Reserve(pb.ReserveRequest(namespace=KEEP_NS, sizes=[10],
                                                             block_hashes=[h]))}[rpc]
    code, _ = call(rpc, req, kept, stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@FUZZ
@given(seconds=st.one_of(st.floats(max_value=-1e-9), st.just(math.nan), st.just(math.inf),
                         st.floats(min_value=301.0)))
def test_a_bad_lease_length_is_invalid(stub, kept, seconds):
    code, _ = call("Acquire", lambda: stub.Acquire(pb.AcquireRequest(
        namespace=KEEP_NS, block_hashes=[kept[0].block_hash], lease_seconds=seconds)),
        kept, stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@FUZZ
@given(gap=st.one_of(st.floats(max_value=-1e-9), st.just(math.nan), st.just(math.inf),
                     st.just(-math.inf)))
def test_a_bad_expected_gap_is_invalid(stub, kept, gap):
    code, _ = call("Hint", lambda: stub.Hint(pb.HintRequest(
        session_id="s", event="tool_call", expected_gap_ms=gap)), kept, stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@FUZZ
@given(n_sizes=st.integers(0, 5), n_hashes=st.integers(0, 5))
def test_mismatched_lists_are_invalid(stub, kept, n_sizes, n_hashes):
    if n_sizes == n_hashes:
        n_hashes += 1
    hashes = [i.to_bytes(32, "big") for i in range(1, n_hashes + 1)]
    code, _ = call("Reserve", lambda: stub.Reserve(pb.ReserveRequest(
        namespace="ns-a", sizes=[100] * n_sizes, block_hashes=hashes)), kept, stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = call("Commit", lambda: stub.Commit(pb.CommitRequest(
        namespace="ns-a", slots=[pb.SlotDescriptor(slot_id=1)] * n_sizes,
        headers=[pb.BlockHeader(block_hash=h) for h in hashes])), kept, stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT


# -- regressions the fuzzing found ----------------------------------------------------
def test_an_error_about_a_long_name_keeps_its_status(stub, kept):
    """A NOT_FOUND naming a 1,024-emoji namespace used to exceed gRPC's trailer limit:
    the client got RESOURCE_EXHAUSTED "Stream removed" instead (messages are capped)."""
    ns = "\U0001f600" * 1024
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Get(pb.GetRequest(namespace=ns, block_hashes=[b"x" * 32])))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "more bytes" in info.value.details()
    assert ("kvstore-error", "NamespaceNotFound") in info.value.trailing_metadata()


@pytest.mark.parametrize("field", ["namespace", "session_id", "workload"])
def test_names_past_the_limit_are_invalid(stub, kept, field):
    """A 60 MB namespace or session id was stored with each block (memory and disk
    headers without bound); now every name field is at most MAX_NAME_CHARS."""
    from kvstore.server.servicer import MAX_NAME_CHARS

    fields = {"namespace": "ns-a", field: "n" * (MAX_NAME_CHARS + 1)}
    put = pb.PutRequest(blocks=[pb.Block(header=pb.BlockHeader(block_hash=b"q" * 32),
                                         payload=b"x")], **fields)
    code, _ = call("Put", lambda: stub.Put(iter([put])), kept, stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = call("Lookup", lambda: stub.Lookup(pb.LookupRequest(
        block_hashes=[b"q" * 32], **fields)), kept, stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    ok = {"namespace": "ns-a", field: "n" * MAX_NAME_CHARS}
    code, _ = call("Lookup", lambda: stub.Lookup(pb.LookupRequest(
        block_hashes=[b"q" * 32], **ok)), kept, stub)
    assert code in (OK, grpc.StatusCode.INVALID_ARGUMENT)  # (a 1,024-char workload is unknown)


def test_a_huge_tool_name_is_invalid(stub, kept):
    code, _ = call("Hint", lambda: stub.Hint(pb.HintRequest(
        session_id="s", event="tool_call", tool="t" * 100_000)), kept, stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT

