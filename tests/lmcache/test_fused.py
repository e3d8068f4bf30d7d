"""The copying retrieve's one pass: copy a chunk and checksum the copy."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from kvstore.connectors.lmcache.fused import PIECE_BYTES, copy_checked


@pytest.mark.parametrize("n", [0, 1, PIECE_BYTES - 1, PIECE_BYTES, 3 * PIECE_BYTES + 17])
def test_copy_checked_copies_and_returns_the_one_shot_digest(n: int) -> None:
    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n, dtype=np.uint8)
    digest = copy_checked(memoryview(dst), memoryview(src))
    assert bytes(dst) == bytes(src)
    assert digest == xxhash.xxh3_64_intdigest(src.tobytes())


def test_copy_checked_refuses_a_destination_of_another_size() -> None:
    with pytest.raises(ValueError, match="destination"):
        copy_checked(memoryview(bytearray(9)), memoryview(bytes(10)))
