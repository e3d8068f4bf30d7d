"""KV tensors in device memory (GPU backends): host staging, one bulk copy per layer.

Saves (:meth:`DeviceKV.snapshot`): after the step's forward, on a side stream
that waits for it, each layer's part of the step's blocks is gathered on the
device (one ``index_select``) and copied to a pinned host buffer (one
device-to-host copy per layer, layer-major). The save thread later copies
those rows into the reserved slots (:meth:`DeviceKV.snapshot_to_bodies`), so
the forward never waits for the sidecar.

Loads (:class:`StagedLoad`): the loaded bodies are copied from the slots into
a reusable pinned staging buffer, layer by layer; as soon as a layer is
staged, one host-to-device copy moves it to the device and one
``index_copy_`` puts it into the blocks, on the load stream, and an event
marks it done. The attention layer waits for that event
(``wait_for_layer_load``), so copying layer ``l + 1`` overlaps the forward of
layer ``l``.

On a host device (no CUDA) the same code runs without streams, events or
pinning; the tests run it that way, ``scripts/gpu_check.sh`` on CUDA.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvstore.connectors.vllm import threads
from kvstore.connectors.vllm.layout import KVLayout
from kvstore.connectors.vllm.rows import ByteRows, copy_rows_parallel

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceKV", "HostPool", "Snapshot", "StagedLoad"]

_MiB = 2**20


class HostPool:
    """Reusable host buffers (pinned on CUDA hosts: pinning costs ms per allocation)."""

    def __init__(self, pin: bool, keep: int = 4) -> None:
        self.pin = pin
        self.keep = keep
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        import torch

        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.numel() >= nbytes:
                    return self._free.pop(i)
        size = max(_MiB, 1 << max(nbytes - 1, 1).bit_length())
        return torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)

    def give(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buf)
            self._free.sort(key=lambda b: b.numel())
            while len(self._free) > self.keep:
                self._free.pop(0)


def _layer_rows(buf: torch.Tensor, n: int, layer_offset: int, length: int,
                positions: Sequence[int]) -> ByteRows:
    """Rows ``positions`` of one layer in a layer-major staging buffer of ``n`` blocks."""
    base = n * layer_offset
    return ByteRows.uniform(buf.numpy(), [base + p * length for p in positions], length)


@dataclass(eq=False)
class Snapshot:
    """A step's blocks copied to host memory, layer-major, once ``event`` completes."""

    buf: torch.Tensor
    n: int
    event: Any = None  # torch.cuda.Event on CUDA
    keep: Any = None  # the pinned ids an asynchronous copy still reads


class DeviceKV:
    """The staged path between device KV tensors and host slots."""

    def __init__(self, layout: KVLayout, host_threads: int = 4) -> None:
        import torch

        self.layout = layout
        #: Threads for host copies (staging <-> slots): one memcpy thread does not
        #: keep up with a PCIe 5 link.
        self.host_threads = max(1, host_threads)
        self.copy_pool = (
            threads.pool(self.host_threads, "kvstore-copy")
            if self.host_threads > 1
            else None
        )
        self.device = layout.device
        self.cuda = self.device.type == "cuda"
        self.pool = HostPool(pin=self.cuda)
        cuda: Any = torch.cuda  # torch.cuda's classes are untyped
        self.save_stream = cuda.Stream(self.device) if self.cuda else None
        self.load_stream = cuda.Stream(self.device) if self.cuda else None

    def host_ids(self, values: Sequence[int]) -> torch.Tensor:
        """A ``long`` host tensor, pinned on CUDA (so that copying it never waits)."""
        import torch

        ids = torch.tensor(list(values), dtype=torch.long)
        return ids.pin_memory() if self.cuda else ids

    # -- saves ----------------------------------------------------------------------
    def snapshot(self, block_ids: Sequence[int]) -> Snapshot:
        """Start copying the blocks to host memory, after the forward that wrote them."""
        import torch

        n = len(block_ids)
        buf = self.pool.take(n * self.layout.block_bytes)
        host_ids = self.host_ids(block_ids)
        if self.save_stream is None:
            for layer in self.layout.layers:
                part = buf[n * layer.offset : n * (layer.offset + layer.nbytes)]
                part.view(n, layer.nbytes).copy_(layer.gather_rows(host_ids))
            return Snapshot(buf, n)
        self.save_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.save_stream):
            # Nothing here waits on the host: the forward is still running.
            ids = host_ids.to(self.device, non_blocking=True)
            for layer in self.layout.layers:
                part = buf[n * layer.offset : n * (layer.offset + layer.nbytes)]
                part.view(n, layer.nbytes).copy_(layer.gather_rows(ids), non_blocking=True)
            cuda: Any = torch.cuda
            event = cuda.Event()
            event.record(self.save_stream)
        return Snapshot(buf, n, event, host_ids)

    def snapshot_to_bodies(
        self, snap: Snapshot, positions: Sequence[int], bodies: ByteRows
    ) -> None:
        """Copy blocks ``positions`` of a snapshot into ``bodies`` (host rows)."""
        if snap.event is not None:
            snap.event.synchronize()
        for layer in self.layout.layers:
            src = _layer_rows(snap.buf, snap.n, layer.offset, layer.nbytes, positions)
            dst = bodies.shifted(layer.offset, layer.nbytes)
            copy_rows_parallel(dst, src, self.copy_pool, self.host_threads)

    def wait_snapshot(self, snap: Snapshot) -> None:
        """Make the compute stream wait until the snapshot has read the blocks
        (before blocks that a preemption freed are written again)."""
        if snap.event is not None:
            import torch

            torch.cuda.current_stream(self.device).wait_event(snap.event)

    def release(self, snap: Snapshot) -> None:
        if snap.event is not None:
            snap.event.synchronize()
        self.pool.give(snap.buf)

    def close(self) -> None:
        if self.copy_pool is not None:
            self.copy_pool.shutdown(wait=True)

    # -- loads ----------------------------------------------------------------------
    def staged_load(self, block_ids: Sequence[int]) -> StagedLoad:
        return StagedLoad(self, block_ids)


@dataclass(eq=False)
class StagedLoad:
    """One step's load through the staging buffer, layer by layer.

    The loading thread calls :meth:`stage` with the slots of some blocks and
    then :meth:`launch` for each layer; the step thread calls :meth:`wait_layer`
    before a layer's attention reads the cache. :meth:`cancel` stops launches
    for good (a late load: the engine recomputes those blocks instead).
    """

    kv: DeviceKV
    block_ids: Sequence[int]
    buf: torch.Tensor | None = None
    launched: list[threading.Event] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    cancelled: bool = False
    _staged: list[int] = field(default_factory=list)
    _ids: dict[tuple[int, ...], Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        n_layers = len(self.kv.layout.layers)
        self.launched = [threading.Event() for _ in range(n_layers)]
        self.events = [None] * n_layers

    def stage(self, positions: Sequence[int], bodies: ByteRows,
              layers: Sequence[int] | None = None) -> None:
        """Copy bodies (host rows) of blocks ``positions`` into the staging buffer."""
        layout = self.kv.layout
        n = len(self.block_ids)
        if self.buf is None:
            self.buf = self.kv.pool.take(n * layout.block_bytes)
        for i in layers if layers is not None else range(len(layout.layers)):
            layer = layout.layers[i]
            dst = _layer_rows(self.buf, n, layer.offset, layer.nbytes, positions)
            src = bodies.shifted(layer.offset, layer.nbytes)
            copy_rows_parallel(dst, src, self.kv.copy_pool, self.kv.host_threads)
        if layers is None or layers[-1] == len(layout.layers) - 1:
            self._staged.extend(positions)

    def launch(self, i: int, positions: Sequence[int]) -> None:
        """Copy layer ``i`` of the staged blocks ``positions`` into the KV cache."""
        import torch

        with self._lock:
            if self.cancelled or self.launched[i].is_set():
                return
            if positions and self.buf is not None:
                layer = self.kv.layout.layers[i]
                n = len(self.block_ids)
                part = self.buf[n * layer.offset : n * (layer.offset + layer.nbytes)]
                pick = list(positions)
                subset = pick != list(range(n))
                stream = self.kv.load_stream
                if stream is None:
                    rows = part.view(n, layer.nbytes)
                    ids = self.kv.host_ids([self.block_ids[p] for p in pick])
                    if subset:
                        rows = rows.index_select(0, self.kv.host_ids(pick))
                    layer.scatter_rows(ids, rows)
                else:
                    with torch.cuda.stream(stream):
                        ids, keep = self._device_ids(pick, subset)
                        # One host-to-device copy of the layer (pinned: asynchronous).
                        rows = part.view(n, layer.nbytes).to(self.kv.device, non_blocking=True)
                        if keep is not None:
                            rows = rows.index_select(0, keep)
                        layer.scatter_rows(ids, rows)
                        cuda: Any = torch.cuda
                        event = cuda.Event()
                        event.record(stream)
                        self.events[i] = event
            self.launched[i].set()

    def _device_ids(self, pick: list[int], subset: bool) -> tuple[Any, Any]:
        """Block ids (and row picks) on the device, copied once per load without a
        host wait (pinned sources, kept until the load is released)."""
        key = tuple(pick)
        found = self._ids.get(key)
        if found is None:
            ids_host = self.kv.host_ids([self.block_ids[p] for p in pick])
            keep_host = self.kv.host_ids(pick) if subset else None
            found = (
                ids_host.to(self.kv.device, non_blocking=True),
                keep_host.to(self.kv.device, non_blocking=True) if keep_host is not None else None,
                (ids_host, keep_host),
            )
            self._ids[key] = found
        return found[0], found[1]

    def finish(self) -> None:
        """Launch what is staged for every layer not launched yet; wake all waiters."""
        for i in range(len(self.launched)):
            self.launch(i, sorted(set(self._staged)))
        for ev in self.launched:
            ev.set()

    def wait_layer(self, i: int, timeout_s: float) -> bool:
        """Order the compute stream after layer ``i``'s copy; False if it is late."""
        if not self.launched[i].wait(timeout_s):
            return False
        event = self.events[i]
        if event is not None:
            import torch

            torch.cuda.current_stream(self.kv.device).wait_event(event)
        return True

    def cancel(self) -> None:
        """No more launches; order the compute stream after those in flight."""
        with self._lock:
            self.cancelled = True
            for i, ev in enumerate(self.launched):
                if ev.is_set() and self.events[i] is not None:
                    import torch

                    torch.cuda.current_stream(self.kv.device).wait_event(self.events[i])
                ev.set()

    def release(self) -> None:
        """Give the staging buffer back once every copy out of it completed."""
        with self._lock:
            for event in self.events:
                if event is not None:
                    event.synchronize()
            buf, self.buf = self.buf, None
            self._ids.clear()
        if buf is not None:
            self.kv.pool.give(buf)
