"""The disk tier as a package: one module per part of the segment store.

- :mod:`.tier`: :class:`DiskTier`, the tier interface over the parts below;
- :mod:`.writes`, :mod:`.startup`: its write path and its first operation's recovery;
- :mod:`.format`: the on-disk layout (records, footers, kill lists);
- :mod:`.segment`: blocking I/O on segment files (``O_DIRECT``, punch, footers);
- :mod:`.log`: the group commit that appends records;
- :mod:`.index`: the compact in-memory index (two ints a block);
- :mod:`.compact`: kill lists and the compactor of sparse segments;
- :mod:`.recover`: restart from footers and kill lists;
- :mod:`.config`: the ``[disk]`` config section.

``DiskTier`` is imported lazily (the tier pulls numpy, msgspec and xxhash), so the
config loader can read :mod:`.config` without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstore.tiers.disk.tier import DiskTier

__all__ = ["DiskTier"]


def __getattr__(name: str) -> Any:
    if name == "DiskTier":
        return importlib.import_module("kvstore.tiers.disk.tier").DiskTier
    raise AttributeError(f"module 'kvstore.tiers.disk' has no attribute {name!r}")
