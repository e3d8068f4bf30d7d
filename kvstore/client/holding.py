"""Reads held past the call: the blocking client's ``hold_in_place`` and ``lookup_and_hold``.

The blocks come back as views of the server's shared memory that outlive the call
(a :class:`~kvstore.client.held.HeldRead` whose lease the client renews while any view
is held). Kept apart from :mod:`kvstore.client.inplace`, whose reads end with the
call: what these add is the lease's life after the call (its renewal and its end),
built on the in-place plumbing (:meth:`InPlace._checksums`, :meth:`InPlace._background`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
from kvstore.client._common import LookupResult, acquired_slots, lookup_request
from kvstore.client.held import HeldRead, Renewal
from kvstore.client.inplace import InPlace
from kvstore.errors import KVStoreError

__all__ = ["Holding"]

log = logging.getLogger("kvstore.client")


class Holding(InPlace):
    """Held reads over the client's channel and segments (a mixin of
    :class:`~kvstore.client.sync.KVStoreClient`, as :class:`InPlace` is)."""

    def hold_in_place(self, namespace: str, hashes: Sequence[bytes], *,
                      lease_seconds: float = 0.0) -> HeldRead | None:
        """The stored blocks of ``hashes`` as views of the server's shared memory that
        outlive the call: one ``Acquire`` (``lease_seconds``: 0 = the server's default
        lease), each slot checked against its checksum, nothing copied. The caller
        lets go of each view (:meth:`HeldRead.let_go`) when done; until then the
        client renews the lease (a view never shows another block's bytes while the
        sidecar is up), and the last one ends it in the background. Blocks stored but not in shared
        memory now come back as None and are listed in ``elsewhere``: read those with
        :meth:`get_each`. A corrupt slot comes back as None and is reported when the
        lease ends. None when the client is not on shared memory (nothing to hold)."""
        hashes = [bytes(h) for h in hashes]
        if not self.uses_shared_memory:
            return None
        return self._held(self._call(self._stub.Acquire, pb.AcquireRequest(
            namespace=namespace, block_hashes=hashes, lease_seconds=lease_seconds)),
            namespace, lease_seconds)

    def lookup_and_hold(self, namespace: str, hashes: Sequence[bytes],
                        session_id: str | None = None, workload: str | None = None, *,
                        request_id: str | None = None, lease_seconds: float = 0.0,
                        num_tokens: int = 0, then: str | None = None,
                        tool: str | None = None, expected_gap_ms: float | None = None,
                        num_computed_tokens: int | None = None
                        ) -> tuple[LookupResult, HeldRead | None]:
        """:meth:`lookup`, and the ``num_hit`` leading blocks held as
        :meth:`hold_in_place` holds them, in one round trip: for a reader that looks
        up a prefix and reads it at once. The lookup counts for the policy as any
        other, with the same arguments (``then``, ``tool``, ``expected_gap_ms``,
        ``num_computed_tokens`` as :meth:`lookup` takes them). The held read
        (None when nothing is held: no hit, or no shared memory) has one entry per
        leading block; a block the lookup found in a tier shared between hosts is not
        held (its view is None, outside ``elsewhere``): read it with :meth:`get_each`."""
        hashes = [bytes(h) for h in hashes]
        hold = self.uses_shared_memory
        resp: pb.LookupResponse = self._call(self._stub.Lookup, lookup_request(
            namespace, hashes, session_id, workload, request_id, num_tokens, then, tool,
            expected_gap_ms, num_computed_tokens, hold=hold, lease_seconds=lease_seconds))
        found = LookupResult.from_pb(resp)
        if not (hold and resp.HasField("held")):
            return found, None
        return found, self._held(resp.held, namespace, lease_seconds)

    def _held(self, resp: pb.AcquireResponse, namespace: str, lease_seconds: float
              ) -> HeldRead:
        """The slots of an Acquire as a :class:`HeldRead`, each checked first, its
        lease renewed while any view is held."""
        expires_at = time.monotonic() + resp.lease_seconds
        release = pb.ReleaseRequest(lease_id=resp.lease_id)
        try:
            slots, sizes, overflow = acquired_slots(resp, self._segments)
            views: list[memoryview | None] = [None] * len(sizes)
            checked = [(i, slot.view()) for i, slot in slots]
            for (i, view), digest in zip(checked, self._checksums([v for _, v in checked]),
                                         strict=True):
                if digest == resp.slots[i].checksum:
                    views[i] = view
                else:
                    sizes[i] = 0
                    release.corrupt_hashes.append(bytes(resp.headers[i].block_hash))
        except BaseException:
            self._release_quietly(release)  # else it ends by the server's clock
            raise

        def ender(req: pb.ReleaseRequest) -> Callable[[], None]:
            def end() -> None:
                if req.corrupt_hashes:  # the server drops the bad copies before a retry
                    self._release_quietly(req)
                    return
                try:
                    self._background(lambda: self._release_quietly(req))
                except RuntimeError:  # the client was closed: its calls are over
                    log.debug("kvstore: held lease %d let go after close", req.lease_id)
            return end

        def renew(held: Sequence[int]) -> Renewal | None:
            """A new lease over the blocks of the views ``held``, if it pins each in
            the very slot its view shows (the old lease still pins them: it does)."""
            asked = time.monotonic()
            try:
                new: pb.AcquireResponse = self._call(self._stub.Acquire, pb.AcquireRequest(
                    namespace=namespace, lease_seconds=lease_seconds,
                    block_hashes=[resp.headers[i].block_hash for i in held]))
            except KVStoreError as exc:
                log.warning("kvstore: could not renew read lease %d: %s", release.lease_id, exc)
                return None
            again = pb.ReleaseRequest(lease_id=new.lease_id)
            same = len(new.slots) == len(held) and all(
                (n.segment, n.offset, n.length) == (o.segment, o.offset, o.length)
                for n, o in zip(new.slots, (resp.slots[i] for i in held), strict=True))
            if not same:
                self._release_quietly(again)
                log.warning("kvstore: read lease %d not renewed: a held block is no longer "
                            "in its slot", release.lease_id)
                return None
            return asked + new.lease_seconds, ender(again)

        held = HeldRead(views, sizes, overflow, expires_at, ender(release), renew,
                        resp.lease_seconds)
        self._renewer.add(held)
        return held
