"""``kvstore events``: tail the ``SubscribeEvents`` stream and print one event per line.

A gRPC client of the server (it may need TLS or a token: :mod:`kvstore.security.client`),
so it lives with the tools above the service, not in :mod:`kvstore.events`, which the
engine imports."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, TextIO

from kvstore.events import wire

__all__ = ["add_parser", "format_event", "func"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "events", help="tail the block event stream of a kvstore server"
    )
    parser.add_argument("--address", default="127.0.0.1:50051", help="server host:port")
    parser.add_argument(
        "--start-seq", type=int, default=-1, help="replay from this sequence (-1: live only)"
    )
    parser.add_argument("--limit", type=int, default=0, help="stop after N batches (0: never)")
    parser.add_argument("--json", action="store_true", help="one JSON object per event")
    parser.set_defaults(func=func)
    return parser


def _hash(value: wire.ExternalBlockHash | None) -> str | int | None:
    return value.hex() if isinstance(value, bytes) else value


def _where(record: dict[str, Any], locality: str | None, ownership: str | None) -> None:
    """vLLM 0.33's locality / ownership, when the event carries them."""
    if locality:
        record["locality"] = locality
    if ownership:
        record["ownership"] = ownership


def format_event(seq: int, ts: float, event: wire.KVCacheEvent, as_json: bool = False) -> str:
    record: dict[str, Any] = {"seq": seq, "ts": round(ts, 6), "type": type(event).__name__}
    if isinstance(event, wire.BlockStored):
        record["type"] = "BlockStored"
        record.update(
            medium=event.medium,
            blocks=[_hash(h) for h in event.block_hashes],
            parent=_hash(event.parent_block_hash),
            block_size=event.block_size,
            tokens=len(event.token_ids),
        )
        if event.lora_name:
            record["lora_name"] = event.lora_name
        _where(record, event.locality, event.ownership)
        if event.session_id:
            record["session_id"] = event.session_id
    elif isinstance(event, wire.BlockRemoved):
        record["type"] = "BlockRemoved"
        record.update(medium=event.medium, blocks=[_hash(h) for h in event.block_hashes])
        _where(record, event.locality, event.ownership)
    else:
        record["type"] = "AllBlocksCleared"
    if as_json:
        return json.dumps(record)
    rest = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("seq", "ts", "type"))
    return f"{seq} {ts:.6f} {record['type']} {rest}".rstrip()


async def tail(
    address: str, start_seq: int, limit: int, as_json: bool, out: TextIO = sys.stdout
) -> int:

    from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
    from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
    from kvstore.security.client import ClientSecurity

    count = 0
    # KVSTORE_TOKEN / KVSTORE_TLS* like every other client command (the events right).
    async with ClientSecurity.from_env().aio_channel(address) as channel:
        stub = pb_grpc.KVStoreStub(channel)
        call = stub.SubscribeEvents(pb.SubscribeRequest(start_seq=start_seq))
        async for msg in call:
            try:
                batch = wire.decode_batch(msg.payload)
            except wire.MalformedBatch as exc:
                print(f"{msg.seq} malformed batch: {exc}", file=sys.stderr)
                continue
            for event in batch.events:
                print(format_event(msg.seq, msg.ts, event, as_json), file=out, flush=True)
            count += 1
            if limit and count >= limit:
                call.cancel()
                break
    return 0


def func(args: argparse.Namespace) -> int:
    import grpc

    try:
        return asyncio.run(tail(args.address, args.start_seq, args.limit, args.json))
    except KeyboardInterrupt:
        return 130
    except grpc.aio.AioRpcError as exc:
        print(
            f"kvstore events: {args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr
        )
        return 1
