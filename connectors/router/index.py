"""Prefix index per pod and tier, built from KV events.

``block hash -> {pod -> media}`` for lookups, and ``pod -> medium -> {hash: copies}``
so removals and ``AllBlocksCleared`` are exact. Copies are counted because vLLM
does not de-duplicate blocks: two physical blocks can cache one hash, each
announced by its own ``BlockStored`` and dropped by its own ``BlockRemoved``.
Media are lower-cased (as llm-d does); an event without a medium is ``gpu``.
vLLM 0.33's ``STORAGE`` is read by its ``locality``: ``disk`` when ``LOCAL``,
``remote`` when ``REMOTE`` (:func:`kvstore.events.media.tier_medium`), so both
vocabularies index (and score) a tier under one name.
``AllBlocksCleared`` forgets everything the pod held, on every tier.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvstore.events.media import tier_medium
from kvstore.events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVCacheEvent,
)

__all__ = ["PrefixIndex"]


class PrefixIndex:
    def __init__(self) -> None:
        self._by_hash: dict[ExternalBlockHash, dict[str, set[str]]] = {}
        self._by_pod: dict[str, dict[str, dict[ExternalBlockHash, int]]] = {}

    # --------------------------------------------------------------- updates
    def apply(self, pod: str, events: Iterable[KVCacheEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.add(pod, tier_medium(event.medium, event.locality), event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.remove(pod, tier_medium(event.medium, event.locality), event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear_pod(pod)

    def add(self, pod: str, medium: str, hashes: Iterable[ExternalBlockHash]) -> None:
        counts = self._by_pod.setdefault(pod, {}).setdefault(medium, {})
        for h in hashes:
            n = counts.get(h, 0)
            counts[h] = n + 1
            if n == 0:
                self._by_hash.setdefault(h, {}).setdefault(pod, set()).add(medium)

    def remove(self, pod: str, medium: str, hashes: Iterable[ExternalBlockHash]) -> None:
        counts = self._by_pod.get(pod, {}).get(medium)
        if counts is None:
            return
        for h in hashes:
            n = counts.get(h, 0)
            if n > 1:
                counts[h] = n - 1
            elif n == 1:
                del counts[h]
                self._forget(h, pod, medium)

    def clear_pod(self, pod: str) -> None:
        for medium, counts in self._by_pod.pop(pod, {}).items():
            for h in counts:
                self._forget(h, pod, medium)

    def _forget(self, h: ExternalBlockHash, pod: str, medium: str) -> None:
        pods = self._by_hash.get(h)
        if pods is None:
            return
        media = pods.get(pod)
        if media is not None:
            media.discard(medium)
            if not media:
                del pods[pod]
        if not pods:
            del self._by_hash[h]

    # --------------------------------------------------------------- lookups
    def holders(self, block_hash: ExternalBlockHash) -> Mapping[str, set[str]]:
        """``{pod: media}`` holding ``block_hash`` (empty when nobody does)."""
        return self._by_hash.get(block_hash, {})

    def blocks(self, pod: str, medium: str | None = None) -> set[ExternalBlockHash]:
        """Hashes ``pod`` holds on ``medium`` (on any medium when ``None``)."""
        tiers = self._by_pod.get(pod, {})
        if medium is not None:
            return set(tiers.get(medium.lower(), ()))
        out: set[ExternalBlockHash] = set()
        for counts in tiers.values():
            out.update(counts)
        return out

    def pods(self) -> list[str]:
        return sorted(p for p, tiers in self._by_pod.items() if any(tiers.values()))

    def __len__(self) -> int:
        return len(self._by_hash)
