"""Prefix index and tier-weighted longest-prefix scorer."""

from __future__ import annotations

import pytest
from kvstore.connectors.router import DEFAULT_WEIGHTS, PrefixIndex, PrefixScorer
from kvstore.connectors.router.scorer import request_block_hashes

from kvstore.events import wire
from kvstore.hashing import PrefixHasher, block_hash_to_int


def _stored(hashes: list[int], medium: str | None = "GPU") -> wire.BlockStored:
    return wire.stored(hashes, None, [0] * 16 * len(hashes), 16, medium)


def test_index_tracks_pods_tiers_and_copies() -> None:
    index = PrefixIndex()
    index.apply("a", [_stored([1, 2, 3]), _stored([1], "cpu"), _stored([9], None)])
    index.apply("b", [_stored([1])])
    assert index.holders(1) == {"a": {"gpu", "cpu"}, "b": {"gpu"}}
    assert index.blocks("a", "GPU") == {1, 2, 3, 9}
    index.apply("a", [_stored([2])])  # a second physical copy of block 2
    index.apply("a", [wire.removed([2, 3], "GPU")])
    assert index.blocks("a", "gpu") == {1, 2, 9}
    index.apply("a", [wire.removed([2], "GPU"), wire.removed([77], "DISK")])
    assert index.blocks("a", "gpu") == {1, 9}
    index.apply("a", [wire.cleared()])
    assert index.blocks("a") == set() and index.holders(1) == {"b": {"gpu"}}
    assert index.pods() == ["b"]


def test_scorer_counts_consecutive_prefix_with_tier_weights() -> None:
    index = PrefixIndex()
    index.apply("gpu-pod", [_stored([1, 2])])
    index.apply("cpu-pod", [_stored([1, 2, 3], "CPU")])
    index.apply("gap-pod", [_stored([1, 3, 4])])  # lacks block 2: only block 1 counts
    index.apply("odd-pod", [_stored([1], "NVME_X")])  # unknown medium weighs 1.0
    scorer = PrefixScorer(index)
    scores = scorer.score([1, 2, 3, 4], ["gpu-pod", "cpu-pod", "gap-pod", "odd-pod", "cold"])
    assert scores == pytest.approx(
        {"gpu-pod": 2.0, "cpu-pod": 2.4, "gap-pod": 1.0, "odd-pod": 1.0, "cold": 0.0}
    )
    assert scorer.best([1, 2, 3, 4], ["gpu-pod", "cpu-pod"]) == ("cpu-pod", pytest.approx(2.4))
    assert scorer.prefix_blocks([1, 2, 3, 4], "gap-pod") == 1
    assert set(DEFAULT_WEIGHTS) == {"gpu", "cpu", "disk", "remote"}


def test_best_tier_of_a_block_counts() -> None:
    index = PrefixIndex()
    index.apply("p", [_stored([1], "DISK"), _stored([1], "GPU"), _stored([2], "REMOTE")])
    assert PrefixScorer(index).score([1, 2]) == pytest.approx({"p": 1.3})


def test_request_hashes_match_event_hashes() -> None:
    hasher = PrefixHasher(16, "sha256_cbor", seed="0")
    tokens = list(range(40))
    assert request_block_hashes(tokens, hasher) == [
        block_hash_to_int(h) for h in hasher.hashes(tokens)
    ]
    first = request_block_hashes(tokens, hasher, "bytes")[0]
    assert isinstance(first, bytes) and len(first) == 32
