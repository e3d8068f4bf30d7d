"""``kvstore serve`` whose reads (``Acquire``) can be slowed or lose blocks, on cue.

A test hook for the connector's asynchronous loads: a read that takes seconds (a slow
tier, a busy sidecar) and a read that loses the blocks from some point on (evicted
between the lookup and the load). What it does is read, at every ``Acquire``, from a
JSON file the test rewrites between requests (absent or ``{}``: nothing)::

    {"delay_s": 2.0, "min_blocks": 8, "keep_first": 5}

``delay_s``: the answer waits that long (the server keeps serving other calls);
``keep_first``: blocks past the first ``keep_first`` are answered missing. Only reads
of at least ``min_blocks`` blocks (default 1) are touched. Used as the command of a
:class:`~tests.vllm.sidecar_proc.Sidecar`::

    Sidecar([python, "tests/vllm/faulty_sidecar.py", FAULTS_FILE], data_dir)

``python`` is the interpreter of the ``kvstore`` executable (the server's venv).
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from pathlib import Path
from typing import Any


def faults(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text() or "{}"))
    except FileNotFoundError:
        return {}


def main() -> int:
    faults_file = Path(sys.argv[1])
    from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
    from kvstore.cli import main as kvstore_main
    from kvstore.server.servicer import KVStoreServicer

    acquire = KVStoreServicer.Acquire

    @functools.wraps(acquire)
    async def faulty(self: Any, request: Any, context: Any) -> Any:
        f = faults(faults_file)
        if len(request.block_hashes) < int(f.get("min_blocks", 1)):
            return await acquire(self, request, context)
        if f.get("delay_s"):
            await asyncio.sleep(float(f["delay_s"]))
        resp = await acquire(self, request, context)
        keep = f.get("keep_first")
        if keep is not None:
            for i in range(int(keep), len(resp.slots)):
                resp.slots[i].CopyFrom(pb.SlotDescriptor())
                resp.headers[i].CopyFrom(pb.BlockHeader())
        return resp

    KVStoreServicer.Acquire = faulty  # type: ignore[method-assign]
    return kvstore_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
