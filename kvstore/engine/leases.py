"""Leases and reservations of the shared-memory data plane, with expiry.

A *reservation* is a slot handed to a client to write, awaiting commit. A
*lease* pins stored blocks while a client reads their slots. Both belong to the
client that took them (``owner``: its gRPC peer; another client's commit, abort
or release is refused) and both end by the server's clock:

* an expired lease unpins its blocks, and a release of it tells the client to
  discard what it read;
* an expired reservation is not freed at once: its slot sits in *quarantine*
  for ``quarantine_s`` more, so a writer that stalled past its reservation
  cannot write into a slot already given to another block. (Reads are verified
  against the block's checksum besides, so a writer stalled even longer is
  caught there.)

Ids are random 63-bit numbers: a client cannot guess another client's slot or
lease.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from kvstore.errors import InvalidArgument, LeaseExpired, PermissionDenied, UnknownReservation
from kvstore.tiers.base import Slot
from kvstore.types import BlockKey

__all__ = ["Lease", "Leases", "Reservation", "check_lease_seconds"]


def _new_id() -> int:
    return secrets.randbits(63) or 1


def check_lease_seconds(seconds: float, default: float, maximum: float) -> float:
    """The lease length to grant for a requested ``seconds`` (0 = the default)."""
    if seconds == 0:
        return default
    if not math.isfinite(seconds) or seconds < 0 or seconds > maximum:
        raise InvalidArgument(
            f"lease_seconds must be 0 (the server default, {default:g} s) or in "
            f"(0, {maximum:g}], got {seconds!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class Reservation:
    key: BlockKey
    slot: Slot
    tier: str
    deadline: float
    owner: str = ""
    #: Where the block goes on commit (the policy's plan): this slot's tier, or
    #: another one it is copied to.
    target: str | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: int
    keys: tuple[BlockKey, ...]
    deadline: float
    owner: str = ""
    #: Payload bytes the lease pins in shared memory.
    nbytes: int = 0


def _check_owner(what: str, owner: str, caller: str) -> None:
    if owner and caller != owner:
        raise PermissionDenied(f"{what} belongs to another client")


class Leases:
    """Owns reservations, read leases and the pin counts they imply."""

    def __init__(self) -> None:
        self._reservations: dict[int, Reservation] = {}
        #: Keys with a live reservation (a count: two clients may reserve one key).
        self.reserved: Counter[Hashable] = Counter()
        self._quarantine: list[tuple[float, Reservation]] = []
        self._leases: dict[int, Lease] = {}
        self._expired_leases: set[int] = set()
        self.pins: Counter[Hashable] = Counter()
        #: Bytes pinned by live leases (a block in two leases counts twice).
        self.pinned_bytes = 0

    @staticmethod
    def new_slot_id() -> int:
        return _new_id()

    # -- reservations -------------------------------------------------------------
    def add_reservation(self, r: Reservation) -> None:
        self._reservations[r.slot.slot_id] = r
        self.reserved[r.key] += 1

    def _unreserve(self, r: Reservation) -> None:
        self.reserved[r.key] -= 1
        if self.reserved[r.key] <= 0:
            del self.reserved[r.key]

    def peek_reservation(self, slot_id: int) -> Reservation | None:
        """The live reservation of ``slot_id`` (left in place), if any."""
        return self._reservations.get(slot_id)

    def take_reservation(self, slot_id: int, now: float, owner: str = "") -> Reservation:
        r = self._reservations.pop(slot_id, None)
        if r is None:
            raise UnknownReservation(
                f"slot {slot_id} was never reserved, was already committed or aborted, "
                "or its reservation expired; reserve it again"
            )
        if r.owner and owner != r.owner:
            self._reservations[slot_id] = r
            _check_owner(f"the reservation of slot {slot_id}", r.owner, owner)
        if r.deadline < now:
            # Put it back so the sweeper quarantines and then frees the slot.
            self._reservations[slot_id] = r
            raise UnknownReservation(
                f"the reservation of slot {slot_id} expired {now - r.deadline:.1f} s ago; "
                "reserve again and write within the lease"
            )
        self._unreserve(r)
        return r

    def expire_reservations(self, now: float, quarantine_s: float) -> list[Reservation]:
        """Move expired reservations to quarantine; return those whose quarantine is
        over (their slots may be freed now)."""
        for r in [r for r in self._reservations.values() if r.deadline < now]:
            del self._reservations[r.slot.slot_id]
            self._unreserve(r)
            self._quarantine.append((now + quarantine_s, r))
        done = [r for until, r in self._quarantine if until <= now]
        if done:
            self._quarantine = [(u, r) for u, r in self._quarantine if u > now]
        return done

    def reserved_keys(self) -> set[BlockKey]:
        return {r.key for r in self._reservations.values()}

    @property
    def quarantined(self) -> int:
        return len(self._quarantine)

    # -- read leases --------------------------------------------------------------
    def acquire(self, keys: tuple[BlockKey, ...], now: float, seconds: float,
                owner: str = "", nbytes: int = 0) -> Lease:
        lease = Lease(_new_id(), keys, now + seconds, owner, nbytes)
        self._leases[lease.lease_id] = lease
        self.pins.update(keys)
        self.pinned_bytes += nbytes
        return lease

    def get(self, lease_id: int, owner: str = "") -> Lease | None:
        lease = self._leases.get(lease_id)
        if lease is not None:
            _check_owner(f"lease {lease_id}", lease.owner, owner)
        return lease

    def release(self, lease_id: int, now: float, owner: str = "") -> Lease:
        lease = self._leases.get(lease_id)
        if lease is None:
            if lease_id in self._expired_leases:
                self._expired_leases.discard(lease_id)
                raise LeaseExpired(
                    f"lease {lease_id} expired before it was released; the blocks read "
                    "under it may have been overwritten: discard them and read again"
                )
            raise LeaseExpired(f"lease {lease_id} is unknown (expired or already released)")
        _check_owner(f"lease {lease_id}", lease.owner, owner)
        del self._leases[lease_id]
        self._end(lease)
        if lease.deadline < now:
            raise LeaseExpired(
                f"lease {lease_id} expired {now - lease.deadline:.1f} s before release; "
                "discard the blocks read under it and read again"
            )
        return lease

    def expire_leases(self, now: float) -> int:
        expired = [lease for lease in self._leases.values() if lease.deadline < now]
        for lease in expired:
            del self._leases[lease.lease_id]
            self._end(lease)
            self._expired_leases.add(lease.lease_id)
        if len(self._expired_leases) > 100_000:  # bounded memory of past ids
            self._expired_leases.clear()
        return len(expired)

    def _end(self, lease: Lease) -> None:
        self.unpin(lease.keys)
        self.pinned_bytes -= lease.nbytes

    def unpin(self, keys: tuple[BlockKey, ...]) -> None:
        for k in keys:
            self.pins[k] -= 1
            if self.pins[k] <= 0:
                del self.pins[k]

    def __len__(self) -> int:
        return len(self._leases)
