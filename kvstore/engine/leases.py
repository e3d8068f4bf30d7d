"""Leases and reservations of the shared-memory data plane, with expiry.

A *reservation* is a slot handed to a client to write, awaiting commit. A
*lease* pins stored blocks while a client reads their slots. Both expire; an
expired reservation frees its slot, an expired lease unpins its blocks, and a
release of an expired lease tells the client to discard what it read.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from kvstore.errors import LeaseExpired, UnknownReservation
from kvstore.tiers.base import Slot
from kvstore.types import BlockKey

__all__ = ["Lease", "Leases", "Reservation"]


@dataclass(frozen=True, slots=True)
class Reservation:
    key: BlockKey
    slot: Slot
    tier: str
    deadline: float


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: int
    keys: tuple[BlockKey, ...]
    deadline: float


class Leases:
    """Owns reservations, read leases and the pin counts they imply."""

    def __init__(self) -> None:
        self._reservations: dict[int, Reservation] = {}
        self._leases: dict[int, Lease] = {}
        self._expired_leases: set[int] = set()
        self._ids = itertools.count(1)
        self.pins: Counter[Hashable] = Counter()

    # -- reservations -------------------------------------------------------------
    def add_reservation(self, r: Reservation) -> None:
        self._reservations[r.slot.slot_id] = r

    def take_reservation(self, slot_id: int, now: float) -> Reservation:
        r = self._reservations.pop(slot_id, None)
        if r is None:
            raise UnknownReservation(
                f"slot {slot_id} was never reserved, was already committed or aborted, "
                "or its reservation expired; reserve it again"
            )
        if r.deadline < now:
            # Put it back so the sweeper frees the slot.
            self._reservations[slot_id] = r
            raise UnknownReservation(
                f"the reservation of slot {slot_id} expired {now - r.deadline:.1f} s ago; "
                "reserve again and write within the lease"
            )
        return r

    def expired_reservations(self, now: float) -> list[Reservation]:
        out = [r for r in self._reservations.values() if r.deadline < now]
        for r in out:
            del self._reservations[r.slot.slot_id]
        return out

    def reserved_keys(self) -> set[BlockKey]:
        return {r.key for r in self._reservations.values()}

    # -- read leases --------------------------------------------------------------
    def acquire(self, keys: tuple[BlockKey, ...], now: float, seconds: float) -> Lease:
        lease = Lease(next(self._ids), keys, now + seconds)
        self._leases[lease.lease_id] = lease
        self.pins.update(keys)
        return lease

    def release(self, lease_id: int, now: float) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            if lease_id in self._expired_leases:
                self._expired_leases.discard(lease_id)
                raise LeaseExpired(
                    f"lease {lease_id} expired before it was released; the blocks read "
                    "under it may have been overwritten: discard them and read again"
                )
            raise LeaseExpired(f"lease {lease_id} is unknown (expired or already released)")
        self.unpin(lease.keys)
        if lease.deadline < now:
            raise LeaseExpired(
                f"lease {lease_id} expired {now - lease.deadline:.1f} s before release; "
                "discard the blocks read under it and read again"
            )

    def expire_leases(self, now: float) -> int:
        expired = [lease for lease in self._leases.values() if lease.deadline < now]
        for lease in expired:
            del self._leases[lease.lease_id]
            self.unpin(lease.keys)
            self._expired_leases.add(lease.lease_id)
        if len(self._expired_leases) > 100_000:  # bounded memory of past ids
            self._expired_leases.clear()
        return len(expired)

    def unpin(self, keys: tuple[BlockKey, ...]) -> None:
        for k in keys:
            self.pins[k] -= 1
            if self.pins[k] <= 0:
                del self.pins[k]

    def __len__(self) -> int:
        return len(self._leases)
