"""The LMCache plugin's copying retrieve, its data path alone: copy-then-check vs fused.

No LMCache: a real sidecar (``kvstore serve``, DRAM only, shared memory), one client, and
``--chunks`` chunks of ``--chunk-mib`` stored once. Each round reads them all into
preallocated destination buffers (LMCache's memory objects stand-in) two ways, taking turns:

* ``then``: ``get_each`` with a sink that copies, the client hashing the slot afterwards
  (the plugin's copying retrieve until 2026-12-02: every byte read twice);
* ``fused``: ``lease_in_place(verify=False)`` (the release in the background, as
  ``get_each`` does it), each slot copied by
  :func:`kvstore.connectors.lmcache.fused.copy_checked` and its copy checked against the
  slot's checksum (the plugin's copying retrieve now);

and a plain ``numpy.copyto`` of the same bytes. Prints medians (ms per round) and ratios::

    .venv/bin/python tests/lmcache/bench_copy_retrieve.py --rounds 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.vllm.sidecar_proc import Sidecar  # noqa: E402


def run(address: str, chunks: int, chunk_bytes: int, rounds: int) -> dict[str, Any]:
    import numpy as np
    from kvstore.connectors.lmcache.fused import copy_checked

    from kvstore.client import KVStoreClient, SlotBuffer
    from kvstore.types import BlockData

    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, chunk_bytes, dtype=np.uint8).tobytes()
                for _ in range(chunks)]
    hashes = [os.urandom(8) for _ in range(chunks)]
    dst = [np.zeros(chunk_bytes, dtype=np.uint8) for _ in range(chunks)]
    src_all = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    dst_all = np.empty_like(src_all)
    times: dict[str, list[float]] = {"then": [], "fused": [], "memcpy": []}
    with KVStoreClient(address) as client:
        client.prefault()
        client.put("bench/copy", [BlockData(h, None, (), p) for h, p in zip(hashes, payloads,
                                                                           strict=True)])

        def then() -> None:
            def sink(j: int, payload: Any) -> int:
                np.copyto(dst[j], np.frombuffer(payload, dtype=np.uint8))
                return len(payload)

            assert all(client.get_each("bench/copy", hashes, sink))

        def fused() -> None:
            def read(batch: Sequence[tuple[int, SlotBuffer]]) -> list[int]:
                return [j for j, s in batch
                        if copy_checked(memoryview(dst[j]), s.view()) != s.checksum]

            assert all(client.lease_in_place("bench/copy", hashes, read, verify=False).sizes)

        def memcpy() -> None:
            np.copyto(dst_all, src_all)

        for fn in (then, fused, memcpy):  # warm up
            fn()
        for _ in range(rounds):
            for name, fn in (("then", then), ("fused", fused), ("memcpy", memcpy)):
                started = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - started) * 1e3)
        assert all(bytes(d) == p for d, p in zip(dst, payloads, strict=True))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"chunks": chunks, "chunk_bytes": chunk_bytes, "rounds": rounds,
            "median_ms": med, "fused_vs_then": med["then"] / med["fused"],
            "memcpy_vs_then": med["memcpy"] / med["then"],
            "memcpy_vs_fused": med["memcpy"] / med["fused"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--chunk-mib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--kvstore-bin", default="",
                    help="the kvstore executable (default: this Python's -m kvstore.cli)")
    args = ap.parse_args()
    command = args.kvstore_bin or [sys.executable, "-m", "kvstore.cli"]
    with tempfile.TemporaryDirectory() as tmp, Sidecar(
        command, Path(tmp) / "sidecar",
        config={"dram": {"capacity": "1GiB"}, "disk": {"enabled": False}},
    ) as sidecar:
        out = run(sidecar.address, args.chunks, args.chunk_mib * 2**20, args.rounds)
    print(json.dumps(out))
    m = out["median_ms"]
    print(f"\n{out['chunks']} x {args.chunk_mib} MiB, median of {out['rounds']} rounds: "
          f"copy then check {m['then']:.2f} ms, fused {m['fused']:.2f} ms, "
          f"memcpy {m['memcpy']:.2f} ms; fused is {out['fused_vs_then']:.2f}x as fast; "
          f"memcpy / then {out['memcpy_vs_then']:.0%}, memcpy / fused {out['memcpy_vs_fused']:.0%}")


if __name__ == "__main__":
    main()
