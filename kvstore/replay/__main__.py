"""``python -m kvstore.replay ...`` == ``kvstore replay ...``."""

from __future__ import annotations

import sys

from kvstore.replay.cli import main

if __name__ == "__main__":
    sys.exit(main(["replay", *sys.argv[1:]]))
