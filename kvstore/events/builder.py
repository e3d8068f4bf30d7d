"""Turns the engine's sink calls into wire events (the bus's encoding step).

Consecutive ``block_stored`` calls on one medium whose blocks chain on each
other (each block's parent is the previous block, same block size) become one
``BlockStored``, as vLLM emits one event per run of newly cached blocks; any
other call ends the run, so event order is call order.

Media are spelled in the configured vocabulary (:mod:`kvstore.events.media`); a
run also ends where the session changes, so each ``BlockStored`` carries the
``session_id`` of the request that stored its blocks.

With ``include_token_ids=False`` every ``BlockStored`` (ours and re-published
foreign ones) carries an empty ``token_ids`` list: the same wire shape vLLM's
decoder reads, ``block_size`` still the real tokens per block, but no prompt
text leaves the host.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import msgspec

from kvstore.events import wire
from kvstore.events.media import wire_medium
from kvstore.types import BlockKey, BlockMeta, Medium

__all__ = ["EventBuilder"]

_MASK64 = 0xFFFF_FFFF_FFFF_FFFF


class EventBuilder:
    def __init__(
        self,
        encoding: wire.Encoding,
        hash_format: wire.HashFormat,
        *,
        include_token_ids: bool = True,
        media: wire.MediaVocabulary = "storage",
    ) -> None:
        self.encoding = encoding
        self.media: wire.MediaVocabulary = media
        self.hash_format = hash_format
        self.include_token_ids = include_token_ids
        self.events: list[wire.KVCacheEvent] = []
        self.blocks = 0
        self._run: list[BlockMeta] = []
        self._run_medium: Medium | None = None
        self._stored_cls = type(wire.stored([], None, [], 0, None, encoding=encoding))

    def _hashes(self, digests: Sequence[bytes]) -> list[wire.ExternalBlockHash]:
        if self.hash_format == "int":
            return [int.from_bytes(d, "big") & _MASK64 for d in digests]
        return [bytes(d) for d in digests]

    def stored(self, metas: Sequence[BlockMeta], medium: Medium) -> None:
        run = self._run
        if run and medium is not self._run_medium:
            self._end_run()
        self._run_medium = medium
        for meta in metas:
            if run:
                prev = run[-1]
                if (meta.parent_hash != prev.key.block_hash
                        or len(meta.token_ids) != len(prev.token_ids)
                        or meta.session_id != prev.session_id):
                    self._end_run()
            run.append(meta)
        self.blocks += len(metas)

    def _end_run(self) -> None:
        run = self._run
        if not run:
            return
        first = run[0]
        if self.hash_format == "int":
            hashes: list[wire.ExternalBlockHash] = [
                int.from_bytes(m.key.block_hash, "big") & _MASK64 for m in run
            ]
        else:
            hashes = [bytes(m.key.block_hash) for m in run]
        parent = self._hashes([first.parent_hash])[0] if first.parent_hash else None
        if not self.include_token_ids:
            tokens: list[int] = []
        elif len(run) == 1:
            tokens = list(first.token_ids)
        else:
            tokens = list(itertools.chain.from_iterable(m.token_ids for m in run))
        medium: str | None = None
        locality = ownership = None
        if self._run_medium is not None:
            medium, locality, ownership = wire_medium(self._run_medium, self.media)
        self.events.append(
            self._stored_cls(hashes, parent, tokens, len(first.token_ids), None, medium, None,
                             locality=locality, ownership=ownership,
                             session_id=first.session_id or None)
        )
        run.clear()

    def removed(self, keys: Sequence[BlockKey], medium: Medium) -> None:
        self._end_run()
        self.blocks += len(keys)
        name, locality, ownership = wire_medium(medium, self.media)
        self.events.append(
            wire.removed(
                self._hashes([k.block_hash for k in keys]), name, encoding=self.encoding,
                locality=locality, ownership=ownership,
            )
        )

    def cleared(self) -> None:
        self._end_run()
        self.events.append(wire.cleared(encoding=self.encoding))

    def foreign(self, events: Sequence[wire.KVCacheEvent]) -> None:
        """Events from elsewhere (vLLM's), re-typed for our encoding and hash format."""
        self._end_run()
        enc, fmt = self.encoding, self.hash_format
        converted = [wire.to_encoding(e, enc, fmt) for e in events]
        if not self.include_token_ids:
            converted = [
                msgspec.structs.replace(e, token_ids=[])
                if isinstance(e, wire.BlockStored) and e.token_ids else e
                for e in converted
            ]
        self.events.extend(converted)

    def take(self) -> list[wire.KVCacheEvent]:
        """The events built so far (the builder starts over)."""
        self._end_run()
        events, self.events = self.events, []
        return events
