"""Media names on the wire: how a tier is spelled in each vocabulary (``events.media``).

=======  ===============================  ======================
tier     ``storage`` (vLLM >= 0.33)        ``tiers`` (older)
=======  ===============================  ======================
hbm      ``GPU``                          ``GPU``
dram     ``CPU`` + ``LOCAL`` / ``dram``   ``CPU``
disk     ``STORAGE`` + ``LOCAL`` / ``disk``   ``DISK``
redis    ``STORAGE`` + ``REMOTE`` / ``redis`` ``REMOTE``
=======  ===============================  ======================

(``medium`` + ``locality`` / ``ownership``.) ``tiers`` sends no locality or ownership,
as kvstore did before. :func:`tier_medium` reads either back to one lower-case name
per tier (``gpu``, ``cpu``, ``disk``, ``remote``), what routers weigh.
"""

from __future__ import annotations

from typing import Final

from kvstore.events.wire import LOCAL, MEDIUM_STORAGE, REMOTE, MediaVocabulary
from kvstore.types import Medium

__all__ = ["WireMedium", "tier_medium", "wire_medium"]

#: (medium, locality, ownership) as a BlockStored / BlockRemoved carries them.
WireMedium = tuple[str, str | None, str | None]

_STORAGE: Final[dict[Medium, WireMedium]] = {
    Medium.GPU: (Medium.GPU.value, None, None),
    Medium.CPU: (Medium.CPU.value, LOCAL, "dram"),
    Medium.DISK: (MEDIUM_STORAGE, LOCAL, "disk"),
    Medium.REMOTE: (MEDIUM_STORAGE, REMOTE, "redis"),
}
_TIERS: Final[dict[Medium, WireMedium]] = {m: (m.value, None, None) for m in Medium}


def wire_medium(medium: Medium, vocabulary: MediaVocabulary) -> WireMedium:
    """How ``medium`` goes on the wire in ``vocabulary``."""
    return (_STORAGE if vocabulary == "storage" else _TIERS)[medium]


def tier_medium(medium: str | None, locality: str | None = None) -> str:
    """One lower-case name per tier from an event of either vocabulary: ``STORAGE``
    is ``disk`` when local (or unspecified) and ``remote`` when ``REMOTE``; no medium
    is ``gpu`` (as llm-d reads it)."""
    if not medium:
        return "gpu"
    name = medium.lower()
    if name == "storage":
        return "remote" if (locality or "").upper() == REMOTE else "disk"
    return name
