"""The ``[dram]`` config section: the DRAM tier's own schema (loaded by :mod:`kvstore.config`).

Kept out of :mod:`kvstore.tiers.dram` so the loader reads it without the tier's imports."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.configtypes import size_field
from kvstore.errors import ConfigError

__all__ = ["DramConfig"]

_SEGMENT_MODES = ("0600", "0660")


@dataclass(frozen=True, slots=True)
class DramConfig:
    enabled: bool = True
    capacity: int = size_field(1 * 2**30)
    #: Prefix of the POSIX shared-memory segment names.
    segment_prefix: str = "kvstore"
    #: Share of the tier that read leases may pin at once (past it, blocks are read
    #: over gRPC), so readers can never leave writers without slots.
    max_pinned_fraction: float = 0.75
    #: "0600": only this server's user maps the segment; "0660": its group too (a
    #: client container running as another user of that group).
    segment_mode: str = "0600"
    #: Group of the segment (a name or a gid); "": the server's own group.
    segment_group: str = ""

    @property
    def mode(self) -> int:
        return int(self.segment_mode, 8)

    def gid(self) -> int | None:
        """``segment_group`` as a gid (None: the server's own group)."""
        if not self.segment_group:
            return None
        if self.segment_group.isdigit():
            return int(self.segment_group)
        import grp

        try:
            return grp.getgrnam(self.segment_group).gr_gid
        except KeyError:
            raise ConfigError(f"dram.segment_group: no group {self.segment_group!r} on this "
                              "host (a group name or a numeric gid)") from None

    def validate(self) -> None:
        if self.enabled and self.capacity <= 0:
            raise ConfigError("dram.capacity: must be > 0 when dram.enabled")
        if self.segment_mode not in _SEGMENT_MODES:
            raise ConfigError(
                f"dram.segment_mode: expected one of {', '.join(map(repr, _SEGMENT_MODES))} "
                f"(a quoted octal string), got {self.segment_mode!r}")
        if self.segment_group and self.segment_mode == "0600":
            raise ConfigError(
                f"dram.segment_group: {self.segment_group!r} cannot map a 0600 segment; set "
                "dram.segment_mode = \"0660\" too")
        self.gid()
        if not 0 < self.max_pinned_fraction <= 1:
            raise ConfigError(
                f"dram.max_pinned_fraction: must be in (0, 1], got {self.max_pinned_fraction}")


