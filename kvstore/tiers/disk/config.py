"""The ``[disk]`` config section: the disk tier's own schema (loaded by :mod:`kvstore.config`)."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.configtypes import size_field
from kvstore.errors import ConfigError

__all__ = ["DiskConfig"]


@dataclass(frozen=True, slots=True)
class DiskConfig:
    enabled: bool = True
    capacity: int = size_field(10 * 2**30)
    #: Segment files directory; default: <data_dir>/disk.
    path: str = ""
    #: Size of one segment file; 0 = capacity / 64 as a power of two, 4 MiB to 1 GiB.
    segment_size: int = size_field(0)
    #: Write and read records with O_DIRECT where the filesystem supports it.
    direct_io: bool = True
    #: The recovery point: a block stored in DRAM that the policy did not drop in the
    #: meantime is queued for write-back to disk at the latest this long after its put,
    #: whatever the policy's own write-back decided (it may write sooner). A policy gets
    #: this long to judge a block worthless (a session's end, a refusal) before it costs
    #: a disk write; a ``kill -9`` loses at most this window (plus the disk's write time).
    max_write_delay_s: float = 2.0

    def validate(self) -> None:
        if self.enabled and self.capacity <= 0:
            raise ConfigError("disk.capacity: must be > 0 when disk.enabled")
        if not 0 <= self.max_write_delay_s <= 3600:
            raise ConfigError(
                f"disk.max_write_delay_s: must be in [0, 3600] seconds, got "
                f"{self.max_write_delay_s!r}")
        if self.segment_size and not (
            1 << 20 <= self.segment_size <= 1 << 40 and self.segment_size % 4096 == 0
        ):
            raise ConfigError(
                f"disk.segment_size: expected 0 (automatic) or a multiple of 4 KiB between "
                f"1 MiB and 1 TiB, got {self.segment_size}"
            )

