"""Tier benchmarks, each next to its raw baseline measured in the same run.

    kvstore bench-tiers dram     [--block-mib 1] [--blocks 256] [--repeats 5]
    kvstore bench-tiers disk     [--block-mib 1] [--blocks 256] [--dir DIR]
    kvstore bench-tiers alloc    [--pool-mib 256]
    kvstore bench-tiers restart  [--blocks 1000000] [--dir DIR]
    kvstore torture    [--iterations 50]

Timings only, no assertions: tests assert behaviour, these measure it. Each
subcommand's ``-h`` says what it prints.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["main"]

COMMANDS = {
    "dram": "kvstore.tools.tiers.dram",
    "disk": "kvstore.tools.tiers.disk",
    "alloc": "kvstore.tools.tiers.alloc",
    "restart": "kvstore.tools.tiers.restart",
    "crash": "kvstore.tools.torture",
}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print(__doc__)
        sys.exit(0 if args and args[0] in ("-h", "--help") else 2)
    importlib.import_module(COMMANDS[args[0]]).main(args[1:])
