"""Block geometry per namespace, for the cost model: how many bytes and tokens a
full block has, and so which tiers a hit is worth loading from.

The server learns it from what is stored (the fullest block seen so far: a
request's last block may be partial). The replay fixes it with :meth:`set`
(the trace's model), while the blocks it stores are small stand-ins: so the
size a block *occupies* in the tiers (``stored_bytes``, what capacity counts)
is kept apart from the size the cost model prices. Until a namespace has
stored anything, the cost model's defaults stand in.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.policies import TierSpec
from kvstore.policies.cost import CostModel

__all__ = ["Geometry"]


class Geometry:
    def __init__(self, cost: CostModel, tiers: Sequence[TierSpec]) -> None:
        self.cost = cost
        self.tiers = tuple(tiers)
        self._geo: dict[str, tuple[int, int]] = {}
        self._fixed: set[str] = set()
        self._stored: dict[str, int] = {}
        self._worth: dict[str, tuple[bool, ...]] = {}

    def set(self, namespace: str, block_bytes: int, block_tokens: int,
            stored_bytes: int | None = None) -> None:
        """Fix the geometry the cost model prices ``namespace``'s blocks at, and (if
        known) the bytes a block occupies in the tiers."""
        self._put(namespace, block_bytes, block_tokens)
        self._fixed.add(namespace)
        if stored_bytes is not None:
            self._stored[namespace] = stored_bytes

    def _put(self, namespace: str, block_bytes: int, block_tokens: int) -> None:
        if block_bytes <= 0 or block_tokens <= 0:
            raise ValueError("block_bytes and block_tokens must be > 0")
        self._geo[namespace] = (block_bytes, block_tokens)
        self._worth.pop(namespace, None)

    def observe(self, namespace: str, size: int, tokens: int) -> None:
        """A block of ``size`` bytes and ``tokens`` tokens was stored."""
        geo = self._geo.get(namespace)
        if tokens > 0 and (geo is None or tokens >= geo[1]):
            self._stored[namespace] = size
            if namespace not in self._fixed and (geo is None or tokens > geo[1]):
                self._put(namespace, size, tokens)

    def stored_bytes(self, namespace: str) -> int:
        """Bytes a full block of ``namespace`` occupies in a tier; 0 until one is stored
        (or the size was set)."""
        return self._stored.get(namespace, 0)

    def known(self, namespace: str) -> bool:
        """Was ``namespace``'s block geometry observed or set (else defaults stand in)?"""
        return namespace in self._geo

    def of(self, namespace: str) -> tuple[int, int]:
        """(bytes, tokens) of a full block of ``namespace``."""
        geo = self._geo.get(namespace)
        return geo if geo is not None else (self.cost.block_bytes, self.cost.block_tokens)

    def worth(self, namespace: str) -> tuple[bool, ...]:
        """Per tier (in order): does loading a block from it beat recomputing it?"""
        w = self._worth.get(namespace)
        if w is None:
            nbytes, tokens = self.of(namespace)
            w = self._worth[namespace] = tuple(
                self.cost.worth_loading(t, nbytes, tokens) for t in self.tiers)
        return w

    def saved_s(self, namespace: str, tier: int) -> float:
        """Prefill seconds one full-block hit in tier number ``tier`` saves."""
        nbytes, tokens = self.of(namespace)
        return float(self.cost.saved_s(self.tiers[tier], nbytes, tokens))
