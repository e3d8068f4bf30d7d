"""What the worker's vLLM engine holds, learned from its own KV events.

:class:`VllmCacheMirror` follows the ingested events (``BlockStored`` /
``BlockRemoved`` per medium, counting copies as vLLM does not de-duplicate
blocks) so the engine can ask which blocks sit in the engine's GPU cache, and
returns the events to re-publish. vLLM's ``AllBlocksCleared`` means *vLLM's*
cache was reset; re-published as is, it would make routers forget the
sidecar's CPU / disk / remote copies too, so it goes out as ``BlockRemoved``
of exactly what vLLM held, per medium.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.events import wire

__all__ = ["VllmCacheMirror"]


class VllmCacheMirror:
    def __init__(self) -> None:
        self._media: dict[str | None, dict[wire.ExternalBlockHash, int]] = {}

    def apply(self, events: Sequence[wire.KVCacheEvent]) -> list[wire.KVCacheEvent]:
        """Update the mirror; return the events to re-publish, in order."""
        out: list[wire.KVCacheEvent] = []
        for event in events:
            if isinstance(event, wire.BlockStored):
                counts = self._media.setdefault(event.medium, {})
                for h in event.block_hashes:
                    counts[h] = counts.get(h, 0) + 1
                out.append(event)
            elif isinstance(event, wire.BlockRemoved):
                counts = self._media.get(event.medium, {})
                for h in event.block_hashes:
                    n = counts.get(h, 0)
                    if n > 1:
                        counts[h] = n - 1
                    elif n == 1:
                        del counts[h]
                out.append(event)
            elif isinstance(event, wire.AllBlocksCleared):
                for medium, counts in self._media.items():
                    if counts:  # a hash repeats once per copy
                        out.append(
                            wire.removed([h for h, n in counts.items() for _ in range(n)], medium)
                        )
                self._media.clear()
        return out

    def blocks(self, medium: str | None = "GPU") -> set[wire.ExternalBlockHash]:
        """Hashes vLLM holds on ``medium`` (``"GPU"``: the engine's own KV cache)."""
        return set(self._media.get(medium, ()))

    def __contains__(self, block_hash: object) -> bool:
        return any(block_hash in counts for counts in self._media.values())

    def __len__(self) -> int:
        return sum(len(c) for c in self._media.values())
