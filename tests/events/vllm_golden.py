"""Runs under the vLLM venv: decodes and produces KV event batches with vLLM's own classes.

Reads one JSON command on stdin, writes one JSON answer on stdout::

    {"decode": [{"name": str, "encoding": "map"|"array", "payload_hex": str}],
     "produce": true, "fields": true,
     "publish": {"endpoint": str, "topic": str, "batches": int}}

``array`` decodes with vLLM's structs re-declared ``array_like=True`` field for
field (that is what vLLM <= 0.23 shipped: the same fields, positional).
Structs go out as ``msgspec.to_builtins`` (bytes as base64).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def _array_variant(cls: Any) -> Any:
    import msgspec

    fields: list[Any] = []
    for f in msgspec.structs.fields(cls):
        if f.default is not msgspec.NODEFAULT:
            fields.append((f.name, f.type, f.default))
        else:
            fields.append((f.name, f.type))
    return msgspec.defstruct(
        cls.__name__, fields, array_like=True, omit_defaults=True, gc=False, tag=cls.__name__
    )


def _classes() -> dict[str, Any]:
    import msgspec
    from vllm.distributed import kv_events as K

    arr = {
        c.__name__: _array_variant(c) for c in (K.BlockStored, K.BlockRemoved, K.AllBlocksCleared)
    }
    union: Any = arr["BlockStored"] | arr["BlockRemoved"] | arr["AllBlocksCleared"]
    batch = msgspec.defstruct(
        "KVEventBatch",
        [("ts", float), ("events", list[union]), ("data_parallel_rank", int | None, None)],
        array_like=True,
        omit_defaults=True,
        gc=False,
    )
    return {"map": K.KVEventBatch, "array": batch, "arr": arr, "K": K}


def _events(K: Any, arr: dict[str, Any] | None, int_hashes: bool) -> list[Any]:
    def h(i: int) -> Any:
        return (0xF000_0000_0000_0000 + i) if int_hashes else i.to_bytes(32, "big")

    def mk(name: str, **kw: Any) -> Any:
        return (arr[name] if arr else getattr(K, name))(**kw)

    return [
        mk(
            "BlockStored",
            block_hashes=[h(1), h(2)],
            parent_block_hash=None,
            token_ids=list(range(64)),
            block_size=32,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[None, None],
            group_idx=0,
        ),
        mk(
            "BlockStored",
            block_hashes=[h(3)],
            parent_block_hash=h(2),
            token_ids=list(range(64, 96)),
            block_size=32,
            lora_id=7,
            medium="CPU",
            lora_name="adapter",
            extra_keys=[("adapter", "salt")],
            session_id="s1",
        ),
        mk("BlockRemoved", block_hashes=[h(1)], medium="GPU", group_idx=0),
        mk("AllBlocksCleared"),
    ]


def main() -> None:
    import msgspec

    cmd = json.load(sys.stdin)
    c = _classes()
    out: dict[str, Any] = {"decoded": {}, "errors": {}}
    for item in cmd.get("decode", []):
        try:
            dec = msgspec.msgpack.decode(
                bytes.fromhex(item["payload_hex"]), type=c[item["encoding"]]
            )
            events = [dict(msgspec.structs.asdict(e), type=type(e).__name__) for e in dec.events]
            out["decoded"][item["name"]] = msgspec.to_builtins(
                {"ts": dec.ts, "dp": dec.data_parallel_rank, "events": events}
            )
        except Exception as exc:  # reported to the test, which fails with it
            out["errors"][item["name"]] = f"{type(exc).__name__}: {exc}"
    if cmd.get("fields"):
        K = c["K"]
        out["fields"] = {cls.__name__: [f.name for f in msgspec.structs.fields(cls)]
                         for cls in (K.BlockStored, K.BlockRemoved, K.AllBlocksCleared)}
        out["media"] = [getattr(K, n, None) for n in ("MEDIUM_GPU", "MEDIUM_CPU",
                                                      "MEDIUM_STORAGE")]
    if cmd.get("produce"):
        enc = msgspec.msgpack.Encoder()
        produced: dict[str, Any] = {}
        for encoding in ("map", "array"):
            for fmt in ("int", "bytes"):
                arr = c["arr"] if encoding == "array" else None
                vllm_events = _events(c["K"], arr, fmt == "int")
                batch = c[encoding](ts=1234.5, events=vllm_events, data_parallel_rank=0)
                produced[f"{encoding}-{fmt}"] = {
                    "payload_hex": enc.encode(batch).hex(),
                    "events": msgspec.to_builtins(
                        [
                            dict(msgspec.structs.asdict(e), type=type(e).__name__)
                            for e in vllm_events
                        ]
                    ),
                }
        out["produced"] = produced
    pub_cmd = cmd.get("publish")
    if pub_cmd:
        K = c["K"]
        pub = K.ZmqEventPublisher(
            data_parallel_rank=0,
            endpoint=pub_cmd["endpoint"],
            replay_endpoint=pub_cmd.get("replay_endpoint"),
            topic=pub_cmd["topic"],
        )
        time.sleep(1.0)  # let the SUB side's subscription reach the connecting PUB
        for i in range(pub_cmd["batches"]):
            pub.publish(
                K.KVEventBatch(ts=time.time(), events=_events(K, None, True)[i % 4 : i % 4 + 1])
            )
        time.sleep(0.5)
        pub.shutdown()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
