"""``kvstore serve`` that also counts the Lookup RPCs it receives, into a file.

The server counts a request's repeated lookups once (its stats and profile are about
requests); a test of how many round trips a client pays needs every call. Used as
the command of a :class:`~tests.vllm.sidecar_proc.Sidecar`::

    Sidecar([python, "tests/vllm/counting_sidecar.py", COUNT_FILE], data_dir)

``python`` is the interpreter of the ``kvstore`` executable (the server's venv).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any


def main() -> int:
    count_file = Path(sys.argv[1])
    from kvstore.cli import main as kvstore_main
    from kvstore.server.servicer import KVStoreServicer

    lookup = KVStoreServicer.Lookup
    calls = 0
    count_file.write_text("0")

    @functools.wraps(lookup)
    async def counted(self: Any, request: Any, context: Any) -> Any:
        nonlocal calls
        calls += 1
        count_file.write_text(str(calls))
        return await lookup(self, request, context)

    KVStoreServicer.Lookup = counted  # type: ignore[method-assign]
    return kvstore_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
