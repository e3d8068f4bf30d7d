"""The worker's own vLLM events: a publisher connecting to the sidecar's ingest
socket (as vLLM does when its endpoint has no ``*``) reaches the sidecar's
stream, re-published next to the sidecar's own, with vLLM's clear turned into
removals of exactly what vLLM held."""

from __future__ import annotations

import asyncio
import contextlib
import time

import zmq

from kvstore import KVStoreClient
from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.events import wire
from tests.blocks import make_chain
from tests.conftest import free_port


def _events(srv, start_seq: int = 0, want: int = 1, timeout: float = 10.0) -> list:
    """Decoded events from the server's bus, via the gRPC stream's source."""

    async def collect() -> list:
        out = []
        async def read() -> None:
            async for batch in srv.server.events.subscribe(start_seq):
                out.extend(wire.decode_batch(batch.payload).events)
                if len(out) >= want:
                    return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(read(), timeout)
        return out

    return srv.run(collect(), timeout + 5)


def test_vllm_events_are_mirrored_and_republished(server_factory):
    port = free_port()
    srv = server_factory(events={"endpoint": "tcp://127.0.0.1:*",
                                 "replay_endpoint": "tcp://127.0.0.1:*",
                                 "ingest_endpoint": f"tcp://127.0.0.1:{port}"})
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.connect(f"tcp://127.0.0.1:{port}")  # vLLM's side: connect, no '*'
    try:
        time.sleep(0.3)  # slow joiner
        gpu = wire.stored([11, 12], None, list(range(64)), 32, "GPU")
        for seq, events in enumerate([[gpu], [wire.cleared()]]):
            pub.send_multipart([b"kv@pod@m", seq.to_bytes(8, "big"),
                                wire.encode_batch(time.time(), events)])
            time.sleep(0.2)
        with KVStoreClient(srv.address) as c:
            c.put("m", make_chain(2, 4096))
        got = _events(srv, want=5)
    finally:
        pub.close(0)
    kinds = [(type(e).__name__, getattr(e, "medium", None)) for e in got]
    # A starting sidecar first tells routers that whatever it announced before is gone.
    assert kinds[0] == ("AllBlocksCleared", None)
    got, kinds = got[1:], kinds[1:]
    assert kinds[0] == ("BlockStored", "GPU") and got[0].block_hashes == [11, 12]
    # vLLM's AllBlocksCleared clears vLLM's cache only: routers get removals of
    # exactly those GPU blocks, not a clear that would also drop the sidecar's copies.
    assert kinds[1] == ("BlockRemoved", "GPU") and sorted(got[1].block_hashes) == [11, 12]
    assert ("BlockStored", "CPU") in kinds[2:]  # the sidecar's own events, same stream
    assert srv.server.vllm_cache is not None and len(srv.server.vllm_cache) == 0


def test_subscribe_events_rpc_resumes_from_a_sequence(server):
    import grpc

    from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc

    with KVStoreClient(server.address) as c:
        c.put("m", make_chain(3, 4096, seed=1))
        c.put("m", make_chain(3, 4096, seed=2))
    with grpc.insecure_channel(server.address) as ch:
        stream = pb_grpc.KVStoreStub(ch).SubscribeEvents(pb.SubscribeRequest(start_seq=0),
                                                         timeout=5)
        first = next(stream)
        assert first.seq == 0 and wire.decode_batch(first.payload).events
        stream.cancel()
