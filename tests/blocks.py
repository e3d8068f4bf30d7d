"""Generated blocks for tests (fast random payloads, chained vLLM-style hashes)."""

from __future__ import annotations

import numpy as np

from kvstore import BlockData
from kvstore.hashing import PrefixHasher


def make_chain(n: int, size: int, *, seed: int = 0, block_tokens: int = 16,
               hasher: PrefixHasher | None = None) -> list[BlockData]:
    """``n`` chained blocks of ``size`` random bytes; hashes as vLLM would compute."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 32000, n * block_tokens).tolist()
    hashes = (hasher or PrefixHasher(block_tokens)).hashes(tokens)
    out = []
    parent = None
    for i, h in enumerate(hashes):
        payload = rng.bytes(size)
        out.append(BlockData(h, parent, tokens[i * block_tokens:(i + 1) * block_tokens], payload))
        parent = h
    return out
