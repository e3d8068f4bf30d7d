"""The sidecar's mirror of its vLLM worker's cache, and publisher restarts."""

from __future__ import annotations

from kvstore.connectors.router import PrefixIndex

from kvstore.events import VllmCacheMirror, wire


def _stored(hashes: list[int], medium: str = "GPU") -> wire.BlockStored:
    return wire.stored(hashes, None, [0] * 16 * len(hashes), 16, medium)


def test_mirror_tracks_copies_and_media() -> None:
    mirror = VllmCacheMirror()
    out = mirror.apply([_stored([1, 2]), _stored([2]), _stored([7], "CPU")])
    assert len(out) == 3 and mirror.blocks() == {1, 2} and mirror.blocks("CPU") == {7}
    mirror.apply([wire.removed([2], "GPU")])
    assert mirror.blocks() == {1, 2}  # one copy of block 2 is left
    mirror.apply([wire.removed([2, 1], "GPU")])
    assert mirror.blocks() == set() and 7 in mirror and len(mirror) == 1


def test_all_cleared_from_vllm_becomes_removals_of_what_vllm_held() -> None:
    mirror = VllmCacheMirror()
    index = PrefixIndex()
    index.add("pod", "cpu", [1])  # the sidecar's own DRAM copy of block 1
    index.apply("pod", mirror.apply([_stored([1, 2]), _stored([2])]))
    out = mirror.apply([wire.cleared()])
    assert not any(isinstance(e, wire.AllBlocksCleared) for e in out)
    index.apply("pod", out)
    assert index.blocks("pod", "gpu") == set() and index.blocks("pod", "cpu") == {1}
    assert len(mirror) == 0
