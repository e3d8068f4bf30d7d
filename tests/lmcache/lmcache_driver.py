"""Runs under the LMCache venv: real ``LMCacheEngine`` s on CPU tensors, driven by a test.

Reads one JSON command per line on stdin and answers one JSON line on the original
stdout (LMCache's own output goes to stderr). Commands::

    {"op": "engine", "name": str, "address": str, "local_cpu": bool, "tenant": str,
     "timeout_s": float, "retry_interval_s": float, "settings": {more plugin settings}}
        -> {"backends", "connected_remotes"}   (remote backends with a connector)
    {"op": "store", "name": str, "prompt": int, "kv_seed": int, "salt": str}
        -> {"seconds", "chunks", "chunk_hashes", "flushed"}   (waits for the puts)
    {"op": "retrieve", "name": str, "prompt": int, "kv_seed": int, "salt": str}
        -> {"seconds", "hit_tokens", "tokens", "equal"}   (bytes equal to kv_seed's KV)
    {"op": "lookup", "name": str, "prompt": int, "salt": str} -> {"hit_tokens"}
        (LMCache's own lookup, as its scheduler asks it: contains and no get)
    {"op": "link", "name": str} -> the plugin's link stats, zero_copy, chunks handed
        over held slots / copied, and what came of the slots held ahead
    {"op": "close", "name": str}

Prompt ``p`` is ``TOKENS`` tokens drawn from seed ``p``; its KV is drawn from
``kv_seed`` (two tenants may hold different KV for the same tokens).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

CHUNK = 256
TOKENS = 4 * CHUNK
LAYERS, HEADS, HEAD_SIZE = 4, 2, 64


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else writes to stdout lands in the log
    import torch
    from kvstore.connectors.lmcache.cpu_kv import PutTracker, destroy_engine, make_engine

    engines: dict[str, tuple[Any, PutTracker, float]] = {}

    def prompt(p: int) -> torch.Tensor:
        return torch.randint(0, 30000, (TOKENS,), generator=torch.Generator().manual_seed(p))

    def kv(seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(2, LAYERS, TOKENS, HEADS * HEAD_SIZE, generator=g).to(torch.bfloat16)

    def configs(salt: str) -> dict[str, Any]:
        return {"request_configs": {"lmcache.tag.cache_salt": salt}} if salt else {}

    def engine(cmd: dict[str, Any]) -> dict[str, Any]:
        prefix = "remote_storage_plugin.kvstore."
        config = {
            "chunk_size": CHUNK, "local_cpu": cmd.get("local_cpu", False),
            "max_local_cpu_size": 0.1, "remote_storage_plugins": ["kvstore"],
            "extra_config": {
                prefix + "module_path": "kvstore.connectors.lmcache",
                prefix + "class_name": "KVStoreConnectorAdapter",
                prefix + "address": cmd["address"],
                prefix + "tenant": cmd.get("tenant", "default"),
                prefix + "timeout_s": cmd.get("timeout_s", 2.0),
                prefix + "retry_interval_s": cmd.get("retry_interval_s", 2.0),
                **{prefix + k: v for k, v in cmd.get("settings", {}).items()},
            },
        }
        eng, _ = make_engine(config, num_layers=LAYERS, num_kv_heads=HEADS, head_size=HEAD_SIZE)
        tracker = PutTracker(eng)
        engines[cmd["name"]] = (eng, tracker, float(cmd.get("timeout_s", 2.0)))
        return {"backends": list(eng.storage_manager.storage_backends),
                "connected_remotes": tracker.tracked}

    def store(cmd: dict[str, Any]) -> dict[str, Any]:
        eng, tracker, timeout = engines[cmd["name"]]
        tokens = prompt(cmd["prompt"])
        started = time.perf_counter()
        eng.store(tokens, kvcaches=kv(cmd["kv_seed"]), **configs(cmd.get("salt", "")))
        flushed = tracker.wait(3 * timeout + 5)
        keys = [k for _, _, k in eng.token_database.process_tokens(tokens)]
        return {"seconds": time.perf_counter() - started, "flushed": flushed,
                "chunks": len(keys), "chunk_hashes": [k.chunk_hash & (2**64 - 1) for k in keys]}

    def retrieve(cmd: dict[str, Any]) -> dict[str, Any]:
        eng, _, _ = engines[cmd["name"]]
        want = kv(cmd["kv_seed"])
        got = torch.zeros_like(want)
        started = time.perf_counter()
        mask = eng.retrieve(prompt(cmd["prompt"]), kvcaches=got, **configs(cmd.get("salt", "")))
        seconds = time.perf_counter() - started
        hit = int(mask.sum())
        return {"seconds": seconds, "hit_tokens": hit, "tokens": TOKENS,
                "equal": bool(torch.equal(got[:, :, :hit], want[:, :, :hit]))}

    def lookup(cmd: dict[str, Any]) -> dict[str, Any]:
        eng, _, _ = engines[cmd["name"]]
        return {"hit_tokens": int(eng.lookup(prompt(cmd["prompt"]),
                                             **configs(cmd.get("salt", ""))))}

    def link(cmd: dict[str, Any]) -> dict[str, Any]:
        eng, _, _ = engines[cmd["name"]]
        backend = eng.storage_manager.storage_backends["RemoteBackend-kvstore"]
        plugin = backend.connection._inner.getWrappedConnector()
        st = plugin.link.stats
        client = plugin.link._client
        return {"up": plugin.link.is_up, "calls": st.calls, "failures": st.failures,
                "skipped": st.skipped, "reconnects": st.reconnects, "refused": st.refused,
                "shared_memory": None if client is None else client.uses_shared_memory,
                "zero_copy": plugin.zero_copy, "handed": dict(plugin.handed),
                "ahead": dict(plugin.ahead.counts), "ahead_now": len(plugin.ahead)}

    def close(cmd: dict[str, Any]) -> dict[str, Any]:
        eng, _, _ = engines.pop(cmd["name"])
        destroy_engine(eng)
        return {}

    ops = {"engine": engine, "store": store, "retrieve": retrieve, "lookup": lookup,
           "link": link, "close": close}
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer = {"ok": True, **ops[cmd["op"]](cmd)}
        except Exception as exc:  # reported to the test, which fails with it
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
    for eng, _, _ in engines.values():
        destroy_engine(eng)


if __name__ == "__main__":
    main()
