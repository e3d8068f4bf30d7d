"""Worker side: move block bytes between vLLM's KV tensors and the sidecar.

Saves: after a step's forward (``wait_for_save``) the blocks it filled are
gathered, all layers of a block into one contiguous payload behind a checked
header (:mod:`.payload`), and stored with one ``put`` per session. Saves are
synchronous, so vLLM may reuse the blocks as soon as the step ends.

Loads: ``start_load_kv`` fetches every block the step loads with one ``get``,
checks each payload against the namespace, the measured layout, the block
hash and its checksum, and scatters the good prefix of each request into its
engine blocks. Blocks it could not load are reported through
``get_block_ids_with_load_errors``; vLLM then recomputes from the first of
them (with ``kv_load_failure_policy="recompute"``). If a backend ever calls
``start_load_kv`` after the forward, ``wait_for_layer_load`` (called by each
attention layer before it reads the cache) runs the pending loads first.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvstore.connectors.vllm.layout import KVLayout, LayoutError
from kvstore.connectors.vllm.metadata import KVStoreConnectorMetadata, WorkerReport
from kvstore.connectors.vllm.payload import (
    HEADER_SIZE,
    PayloadError,
    layout_digest,
    pack_header,
    unpack_body,
)
from kvstore.connectors.vllm.sidecar import SidecarLink

from kvstore.types import BlockData

if TYPE_CHECKING:
    import torch

__all__ = ["WorkerSide"]

logger = logging.getLogger("kvstore.connectors.vllm")


class WorkerSide:
    def __init__(self, link: SidecarLink, namespace: str, num_blocks: int, block_size: int) -> None:
        self.link = link
        self.namespace = namespace
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout: KVLayout | None = None
        self._digest = 0
        self._pending: KVStoreConnectorMetadata | None = None
        self._invalid: set[int] = set()
        self._report = WorkerReport()
        self._holds: dict[str, float] = {}  # req id -> monotonic release time

    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        try:
            self.layout = KVLayout(kv_caches, self.num_blocks)
        except LayoutError as exc:
            logger.error("kvstore: unsupported KV cache layout, connector disabled: %s", exc)
            return
        self._digest = layout_digest(self.namespace, self.layout.signature)
        logger.info(
            "kvstore: namespace %s, %d KV tensors, %d bytes per block (%s)",
            self.namespace,
            len(self.layout.layers),
            self.layout.block_bytes,
            self.layout.signature[:200],
        )

    # -- loads ------------------------------------------------------------------
    def start_load_kv(self, meta: KVStoreConnectorMetadata) -> None:
        self._holds.update((r, time.monotonic() + s) for r, s in meta.holds.items())
        if meta.loads:
            self._pending = meta
            self._load_pending()

    def wait_for_layer_load(self) -> None:
        if self._pending is not None:
            self._load_pending()

    def _load_pending(self) -> None:
        meta, self._pending = self._pending, None
        if meta is None or not meta.loads:
            return
        if self.layout is None:
            for plan in meta.loads:
                self._fail(plan.req_id, plan.block_ids)
            return
        started = time.perf_counter()
        hashes = [h for plan in meta.loads for h in plan.hashes]
        found = self.link.call("get", lambda c: c.get(self.namespace, hashes), None)
        if found is None or len(found) != len(hashes):
            found = [None] * len(hashes)
        layout = self.layout
        ids: list[int] = []
        bodies: list[memoryview] = []
        cursor = 0
        for plan in meta.loads:
            good = 0
            for block_hash, block in zip(
                plan.hashes, found[cursor : cursor + len(plan.hashes)], strict=True
            ):
                body = self._check(layout, block_hash, block)
                if body is None:
                    break
                bodies.append(body)
                good += 1
            cursor += len(plan.hashes)
            ids.extend(plan.block_ids[:good])
            if good:
                self._count(self._report.loaded, plan.req_id, good)
            if good < len(plan.block_ids):
                self._fail(plan.req_id, plan.block_ids[good:])
        if ids:
            self._scatter(layout, ids, bodies)
        elapsed = time.perf_counter() - started
        nbytes = len(ids) * (layout.block_bytes + HEADER_SIZE)
        for plan in meta.loads:
            self._report.load_ms[plan.req_id] = elapsed * 1e3
            self._report.load_bytes[plan.req_id] = len(plan.hashes) * (
                layout.block_bytes + HEADER_SIZE
            )
        logger.info(
            "kvstore: loaded %d/%d blocks (%d tokens, %.1f MiB) in %.1f ms (%.2f GB/s)",
            len(ids),
            len(hashes),
            len(ids) * self.block_size,
            nbytes / 2**20,
            elapsed * 1e3,
            nbytes / elapsed / 1e9 if elapsed > 0 else 0.0,
        )

    def _check(
        self, layout: KVLayout, block_hash: bytes, block: BlockData | None
    ) -> memoryview | None:
        if block is None:
            return None
        try:
            return unpack_body(block.payload, self._digest, block_hash, layout.block_bytes)
        except PayloadError as exc:
            logger.warning("kvstore: not loading block %s: %s", block_hash.hex()[:16], exc)
            return None

    @staticmethod
    def _scatter(layout: KVLayout, ids: list[int], bodies: list[memoryview]) -> None:
        import numpy as np
        import torch

        staged = torch.empty((len(ids), layout.block_bytes), dtype=torch.uint8)
        rows = staged.numpy()
        for i, body in enumerate(bodies):
            rows[i] = np.frombuffer(body, dtype=np.uint8)
        layout.scatter(ids, staged)

    def _fail(self, req_id: str, block_ids: tuple[int, ...]) -> None:
        self._invalid.update(block_ids)
        self._count(self._report.load_failed, req_id, len(block_ids))

    # -- saves ------------------------------------------------------------------
    def wait_for_save(self, meta: KVStoreConnectorMetadata) -> None:
        if not meta.saves or self.layout is None:
            return
        started = time.perf_counter()
        ids = [b.block_id for plan in meta.saves for b in plan.blocks]
        rows = self.layout.gather(ids).numpy()
        groups: dict[tuple[str, str], list[tuple[str, BlockData]]] = defaultdict(list)
        row = 0
        for plan in meta.saves:
            for b in plan.blocks:
                body = memoryview(rows[row])
                row += 1
                payload = b"".join((pack_header(self._digest, b.block_hash, body), body))
                block = BlockData(b.block_hash, b.parent_hash, b.token_ids, payload)
                groups[(plan.session_id, plan.workload)].append((plan.req_id, block))
        for (session_id, workload), items in groups.items():
            blocks = [block for _, block in items]
            ok = self.link.call(
                "put",
                lambda c, blocks=blocks, s=session_id, w=workload: c.put(
                    self.namespace, blocks, session_id=s, workload=w
                ),
                None,
            )
            counts = self._report.saved if ok is not None else self._report.save_failed
            for req_id, _ in items:
                self._count(counts, req_id, 1)
        logger.debug(
            "kvstore: saved %d blocks in %.1f ms", len(ids), (time.perf_counter() - started) * 1e3
        )

    # -- reporting ----------------------------------------------------------------
    @staticmethod
    def _count(counts: dict[str, int], req_id: str, n: int) -> None:
        counts[req_id] = counts.get(req_id, 0) + n

    def get_finished(self, finished_req_ids: set[str]) -> set[str] | None:
        """Held requests whose hold is over: vLLM may free their blocks now."""
        if not self._holds:
            return None
        now = time.monotonic()
        done = {r for r, until in self._holds.items() if until <= now}
        for req_id in done:
            del self._holds[req_id]
        return done or None

    def take_load_errors(self) -> set[int]:
        errors, self._invalid = self._invalid, set()
        return errors

    def take_report(self) -> WorkerReport | None:
        if self._report.is_empty():
            return None
        report, self._report = self._report, WorkerReport()
        return report
