"""The CUDA backend of the Device interface: copy streams, events, a pinned host pool.

Importing this module never touches CUDA; constructing ``CudaDevice`` without a usable GPU
raises ``OutcoreError`` saying what to use instead.

Streams: compute work runs on the current stream (read at every call, so an executor that
runs under ``torch.cuda.stream(s)`` is followed); copies run on one D2H and one H2D stream.
Discipline, so that no memory is reused while a copy still reads or writes it:

* Offload: an event recorded on the compute stream after the producer is waited on by the
  D2H stream before the copy; the source storage is ``record_stream``-ed on the D2H stream,
  so the caching allocator does not hand its block out again until the copy has run, even
  if the executor drops the tensor before ``wait_offload``.
* Prefetch: the device tensor is allocated on the compute stream (counted by the tracker);
  the H2D stream waits on an event recorded after that allocation (the block may still be
  in use by earlier compute work) and on the D2H copy of the same tensor, then copies; the
  destination is ``record_stream``-ed on the H2D stream. ``wait_prefetch`` makes the compute
  stream wait on the copy's event (no host blocking).
* Host copies live in a pinned ``HostPool`` (few big page-locked segments, carved by
  offsets); a slot is reused only after the events of every copy touching it completed.

Memory accounting: the tracker counts storages as on any device, with ``capacity`` checked
against ``torch.cuda.mem_get_info`` at construction; a real CUDA out-of-memory during a
prefetch is reported as ``DeviceOutOfMemory`` naming the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import torch

from outcore.errors import DeviceOutOfMemory, OutcoreError, ScheduleError
from outcore.runtime.devices.copy_engine import Direction
from outcore.runtime.devices.host_pool import HostPool, HostSlot
from outcore.runtime.devices.stats import DirectionStats, TransferStats
from outcore.runtime.devices.storage import TensorLayout, byte_view
from outcore.runtime.tracker import MemoryTracker

#: Default size of the first pinned host segment.
DEFAULT_HOST_POOL_BYTES = 1 << 30


@dataclass(eq=False)
class _Copy:
    """One asynchronous copy: timing events recorded on its stream around it."""

    direction: Direction
    nbytes: int
    start: torch.cuda.Event
    end: torch.cuda.Event

    def seconds(self) -> float | None:
        """Duration once the copy has completed, else None."""
        return self.start.elapsed_time(self.end) / 1e3 if self.end.query() else None


@dataclass(eq=False)
class _Host:
    """A host copy in the pinned pool and the events of every copy that touched it."""

    layout: TensorLayout
    slot: HostSlot
    offload: _Copy
    readers: list[torch.cuda.Event] = field(default_factory=list)


def _pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class CudaDevice:
    """A CUDA GPU behind the Device interface.

    Args:
        capacity: device bytes the tracker allows (None: unbounded, still counted); must
            not exceed what the GPU has free.
        index: CUDA device index (default: the current device).
        host_pool_bytes: size of the first pinned host segment.
    """

    name = "cuda"

    def __init__(self, capacity: int | None = None, *, index: int | None = None,
                 host_pool_bytes: int = DEFAULT_HOST_POOL_BYTES) -> None:
        if not torch.cuda.is_available():
            raise OutcoreError(
                "CudaDevice needs a CUDA build of PyTorch and a visible GPU, but "
                f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA "
                f"{torch.version.cuda}). Use device='cpu-emulated' to run without a GPU.")
        self.device = torch.device("cuda", torch.cuda.current_device() if index is None
                                   else index)
        if capacity is not None:
            free, total = torch.cuda.mem_get_info(self.device)
            cached = (torch.cuda.memory_reserved(self.device)
                      - torch.cuda.memory_allocated(self.device))
            if capacity > free + cached:
                raise DeviceOutOfMemory(f"<capacity of {self.device}>", capacity,
                                        free + cached, total)
        self.tracker = MemoryTracker(capacity)
        self._streams = {"d2h": torch.cuda.Stream(self.device),
                         "h2d": torch.cuda.Stream(self.device)}
        self._pool = HostPool(host_pool_bytes, _pinned)
        self._host: dict[int, _Host] = {}
        self._prefetches: dict[int, _Copy] = {}
        self._retired: list[tuple[HostSlot, list[torch.cuda.Event]]] = []
        self._copies: list[_Copy] = []  # copies not yet folded into _totals
        self._totals = {"d2h": DirectionStats(), "h2d": DirectionStats()}

    @property
    def capacity(self) -> int | None:
        return self.tracker.capacity

    @property
    def compute_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    # -- offload -----------------------------------------------------------------------------
    def start_offload(self, tid: int, t: torch.Tensor, name: str = "") -> None:
        """Queue a D2H copy of ``t``'s storage into a pinned slot, after its producer."""
        if t.device != self.device:
            raise ValueError(f"tensor {name or tid} is on {t.device}, not {self.device}")
        layout = TensorLayout.of(t)
        slot = self._slot(layout.nbytes)
        src = byte_view(t.untyped_storage())
        stream = self._streams["d2h"]
        copy = self._launch("d2h", layout.nbytes, stream, [self._mark()],
                            dst=slot.view, src=src)
        src.record_stream(stream)
        old = self._host.pop(tid, None)
        if old is not None:
            self._retire(old)
        self._host[tid] = _Host(layout, slot, copy)

    def wait_offload(self, tid: int) -> None:
        """Order the compute stream after the D2H copy of ``tid`` (no host blocking)."""
        entry = self._host.get(tid)
        if entry is None:
            raise ScheduleError(f"wait for the offload of tensor {tid}, but none was started; "
                                "an Offload must come before its Wait")
        self.compute_stream.wait_event(entry.offload.end)

    def release(self, tid: int, t: torch.Tensor, last_alias: bool) -> None:
        """Nothing to do: ``record_stream`` already keeps an in-flight source alive."""

    # -- prefetch ----------------------------------------------------------------------------
    def start_prefetch(self, tid: int, name: str) -> torch.Tensor:
        """Allocate ``tid`` on the compute stream (tracked) and queue its H2D copy."""
        entry = self._host.get(tid)
        if entry is None:
            raise ScheduleError(f"prefetch of {name!r} (tensor {tid}) but it has no host copy; "
                                "a Prefetch must follow the tensor's Offload")
        layout = entry.layout
        self.tracker.naming = name
        try:
            raw = torch.empty(layout.nbytes, dtype=torch.uint8, device=self.device)
        except torch.cuda.OutOfMemoryError as exc:
            free, total = torch.cuda.mem_get_info(self.device)
            raise DeviceOutOfMemory(name, layout.nbytes, free, total) from exc
        storage = raw.untyped_storage()
        del raw
        dst = byte_view(storage)
        stream = self._streams["h2d"]
        copy = self._launch("h2d", layout.nbytes, stream, [self._mark(), entry.offload.end],
                            dst=dst, src=entry.slot.view)
        dst.record_stream(stream)
        entry.readers.append(copy.end)
        self._prefetches[tid] = copy
        return layout.view(storage)

    def wait_prefetch(self, tid: int) -> None:
        """Order the compute stream after the H2D copy of ``tid`` (no host blocking)."""
        copy = self._prefetches.get(tid)
        if copy is None:
            raise ScheduleError(f"wait for the prefetch of tensor {tid}, but none was started; "
                                "a Prefetch must come before its Wait")
        self.compute_stream.wait_event(copy.end)

    # -- housekeeping ------------------------------------------------------------------------
    def drop_host(self, tid: int) -> None:
        """Forget the host copy; its slot is reused once every copy touching it is done."""
        entry = self._host.pop(tid, None)
        self._prefetches.pop(tid, None)
        if entry is not None:
            self._retire(entry)

    def synchronize(self) -> None:
        """Block the host until every stream of the device is idle."""
        torch.cuda.synchronize(self.device)
        self._reclaim(block=False)
        self._fold()

    def host_bytes(self) -> int:
        return sum(e.layout.nbytes for e in self._host.values())

    def stats(self) -> TransferStats:
        """Bytes and copy-stream seconds of the completed copies (blocked time is not
        observable without a profiler: the compute stream waits on the GPU, not the host)."""
        self._fold()
        return TransferStats(self._totals["d2h"], self._totals["h2d"])

    def reset_stats(self) -> None:
        self._fold()
        self._totals = {"d2h": DirectionStats(), "h2d": DirectionStats()}

    def close(self) -> None:
        """Wait for the copies in flight and give the host slots back."""
        self.synchronize()
        for tid in list(self._host):
            self.drop_host(tid)
        self._reclaim(block=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _mark(self) -> torch.cuda.Event:
        """An event at the current point of the compute stream."""
        event = torch.cuda.Event()
        event.record(self.compute_stream)
        return event

    def _launch(self, direction: Direction, nbytes: int, stream: torch.cuda.Stream,
                after: list[torch.cuda.Event], dst: torch.Tensor,
                src: torch.Tensor) -> _Copy:
        for event in after:
            stream.wait_event(event)
        copy = _Copy(direction, nbytes, torch.cuda.Event(enable_timing=True),
                     torch.cuda.Event(enable_timing=True))
        copy.start.record(stream)
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        copy.end.record(stream)
        self._copies.append(copy)
        return copy

    def _fold(self) -> None:
        """Move completed copies from ``_copies`` into the running totals."""
        pending = []
        for copy in self._copies:
            seconds = copy.seconds()
            if seconds is None:
                pending.append(copy)
                continue
            old = self._totals[copy.direction]
            self._totals[copy.direction] = DirectionStats(
                bytes=old.bytes + copy.nbytes, copies=old.copies + 1,
                busy_s=old.busy_s + seconds)
        self._copies = pending

    def _slot(self, nbytes: int) -> HostSlot:
        """A pinned slot: reuse retired slots whose copies are done, block on the others
        before growing the pool."""
        self._reclaim(block=False)
        slot = self._pool.try_alloc(nbytes)
        if slot is None and self._retired:
            self._reclaim(block=True)
            slot = self._pool.try_alloc(nbytes)
        return slot if slot is not None else self._pool.alloc(nbytes)

    def _retire(self, entry: _Host) -> None:
        self._retired.append((entry.slot, [entry.offload.end, *entry.readers]))

    def _reclaim(self, block: bool) -> None:
        keep = []
        for slot, events in self._retired:
            if block:
                for event in events:
                    event.synchronize()
            if all(event.query() for event in events):
                self._pool.free(slot)
            else:
                keep.append((slot, events))
        self._retired = keep
