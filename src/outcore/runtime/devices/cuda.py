"""The CUDA backend of the Device interface: copy streams, events, a pinned host pool.

Importing this module never touches CUDA; constructing ``CudaDevice`` without a usable GPU
raises ``OutcoreError`` saying what to use instead. docs/cuda.md lists the PyTorch
semantics this relies on and what the emulated device does not check.

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
  destination is ``record_stream``-ed on the H2D stream.
* Waits make the compute stream wait on the copy's end event (no host blocking); with
  ``timing`` on, events on the compute stream just before and after measure how long it
  stood still (the exposed transfer time, ``TransferStats.*.blocked_s``).
* Host copies live in a ``HostPool`` of page-locked segments carved by offsets: each segment
  is a plain host allocation pinned with ``cudaHostRegister`` for exactly its size (not
  ``pin_memory=True``, whose caching host allocator rounds every block up to a power of
  two). ``reserve_host(sizes)`` sizes the pool from the plan before the first step. A slot
  is reused only after the events of every copy touching it completed (``SlotReuse``).
* Host-side work (segments, slot views, the copy calls) runs outside the caller's dispatch
  modes, so the executor's ``MemoryTracker`` counts only device storages.
* Weights held in host memory (``hold_on_host``): the parameter itself, a contiguous
  tensor in pinned memory (``outcore.runtime.host_weights.pin_parameters``), is the host
  copy its prefetches read; a gradient sent to host memory is an ordinary offload, read
  back with ``host_tensor``. Waits never block the host, so host code that reads a host
  copy or writes a held parameter first synchronizes on ``copy_event`` (the overlapped
  optimizer step, ``outcore.weights.host_step``) or on ``synchronize``.

Memory accounting: the tracker counts storages as on any device, with ``capacity`` checked
against ``torch.cuda.mem_get_info`` at construction; a real CUDA out-of-memory during a
prefetch is reported as ``DeviceOutOfMemory`` naming the tensor.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass, field
from typing import Self

import torch
from torch.utils._python_dispatch import _disable_current_modes

from outcore.errors import DeviceOutOfMemory, OutcoreError, ScheduleError
from outcore.runtime.devices.cuda_events import (
    CopyLedger,
    CopyRecord,
    Direction,
    Event,
    SlotReuse,
    WaitRecord,
)
from outcore.runtime.devices.host_pool import HostPool, HostSlot, align_up
from outcore.runtime.devices.stats import TransferStats
from outcore.runtime.devices.storage import TensorLayout, byte_view
from outcore.runtime.tracker import MemoryTracker

#: Size of the first pinned host segment when nothing was reserved.
DEFAULT_HOST_POOL_BYTES = 64 << 20
#: Offset alignment of host slots (a cache line; copies of any alignment are correct).
HOST_ALIGNMENT = 64
#: cudaHostRegisterPortable: the pages count as pinned for every CUDA context, not only
#: the current device's.
_HOST_REGISTER_PORTABLE = 1


@dataclass(eq=False)
class _Host:
    """A host copy and the events of every copy that touched it: a slot of the pinned pool
    (an offload), or, ``slot`` None, a parameter held in host memory (``hold_on_host``),
    whose bytes are its own. ``source`` is the flat uint8 tensor over the copy's bytes;
    ``waited``: its Wait(d2h) was issued (or it is held), so it may be read once
    ``offload.end`` completed."""

    layout: TensorLayout
    slot: HostSlot | None
    offload: CopyRecord
    source: torch.Tensor
    readers: list[Event] = field(default_factory=list)
    waited: bool = False


def pin_exact(nbytes: int) -> torch.Tensor:
    """A host buffer of exactly ``nbytes`` (to the page), page-locked with cudaHostRegister.

    Falls back to ``pin_memory=True`` (power-of-two rounding) when this torch build has no
    ``cudaHostRegister`` binding."""
    cudart = torch.cuda.cudart()
    register = getattr(cudart, "cudaHostRegister", None)
    if register is None:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    status = int(register(buffer.data_ptr(), nbytes, _HOST_REGISTER_PORTABLE))
    if status != 0:
        raise OutcoreError(f"cudaHostRegister of {nbytes} bytes of host memory failed with "
                           f"CUDA error {status}; lower host_budget= or free host memory")
    return buffer


def pin_pages(nbytes: int) -> torch.Tensor:
    """Like ``pin_exact``, but the registered pages lie wholly inside this allocation (it
    is over-allocated by two pages and the returned view starts on a page boundary), so a
    later ``cudaHostRegister`` of a neighbouring allocation can never find them already
    registered. For segments that live long, beside the pool (held parameters)."""
    cudart = torch.cuda.cudart()
    register = getattr(cudart, "cudaHostRegister", None)
    if register is None:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    page = os.sysconf("SC_PAGE_SIZE")
    raw = torch.empty(nbytes + 2 * page, dtype=torch.uint8)
    start = -raw.data_ptr() % page
    # a storage of its own starting on the page (a slice shares raw's memory and keeps it
    # alive), so is_pinned(), which asks about a tensor's storage, sees registered pages
    buffer = torch.empty(0, dtype=torch.uint8).set_(raw.untyped_storage()[start:start + nbytes])
    status = int(register(buffer.data_ptr(), align_up(nbytes, page), _HOST_REGISTER_PORTABLE))
    if status != 0:
        raise OutcoreError(f"cudaHostRegister of {nbytes} bytes of host memory failed with "
                           f"CUDA error {status}; lower the budget's host share or free "
                           "host memory")
    return buffer


def unpin_exact(buffer: torch.Tensor) -> None:
    """Undo ``pin_exact`` (a no-op for a ``pin_memory=True`` buffer)."""
    unregister = getattr(torch.cuda.cudart(), "cudaHostUnregister", None)
    if unregister is not None:
        unregister(buffer.data_ptr())


class CudaDevice:
    """A CUDA GPU behind the Device interface.

    Args:
        capacity: device bytes the tracker allows (None: unbounded, still counted); must
            not exceed what the GPU has free.
        index: CUDA device index (default: the current device).
        host_pool_bytes: size of the first pinned host segment when ``reserve_host`` was not
            called (the pool grows by doubling past it).
        host_limit: bytes the pinned pool may hold in all (None: no limit); a growth past it
            raises ``outcore.host.HostOutOfMemory``.
        timing: record timing events around copies and Waits (busy and exposed seconds).
        copy_delay_cycles: before every copy, spin the copy stream for this many GPU clock
            cycles (``torch.cuda._sleep``): a deliberately slow copy engine, for race tests.
        poison: fill each prefetched buffer with NaN (integers: 0xFF bytes) on the compute
            stream before its copy, so a read before ``wait_prefetch`` sees poison.
    """

    name = "cuda"
    #: the GPU's allocator holds the memory; the tracker checks the budget on it
    tracker_is_memory = False

    def __init__(self, capacity: int | None = None, *, index: int | None = None,
                 host_pool_bytes: int = DEFAULT_HOST_POOL_BYTES, host_limit: int | None = None,
                 timing: bool = True, copy_delay_cycles: int = 0, poison: bool = False) -> None:
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
        self.timing = timing
        self.copy_delay_cycles = copy_delay_cycles
        self.poison = poison
        self._streams = {"d2h": torch.cuda.Stream(self.device),
                         "h2d": torch.cuda.Stream(self.device)}
        self.pool = HostPool(host_pool_bytes, pin_exact, HOST_ALIGNMENT, release=unpin_exact,
                             limit=host_limit)
        self._host: dict[int, _Host] = {}
        self._prefetches: dict[int, CopyRecord] = {}
        self._slots = SlotReuse(self.pool)
        self._ledger = CopyLedger()
        # Pinned pages must be unregistered before their memory is freed: if the device is
        # dropped unclosed, this still waits for the copies and unpins (it holds no self).
        self._finalizer = weakref.finalize(self, _release_pool, self.pool, self.device)
        self._closed = False

    @property
    def capacity(self) -> int | None:
        return self.tracker.capacity

    @property
    def compute_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def reserve_host(self, sizes: list[int]) -> int:
        """Pin, now, one segment holding host copies of ``sizes`` bytes (a plan's offloads,
        see ``PlannedStep.host_sizes``); returns the bytes reserved."""
        total = sum(align_up(n, HOST_ALIGNMENT) for n in sizes)
        with _disable_current_modes():
            self.pool.reserve(total)
        return total

    # -- offload -----------------------------------------------------------------------------
    def start_offload(self, tid: int, t: torch.Tensor, name: str = "") -> None:
        """Queue a D2H copy of ``t``'s storage into a pinned slot, after its producer."""
        self._check_open()
        if t.device != self.device:
            raise ValueError(f"tensor {name or tid} is on {t.device}, not {self.device}")
        with _disable_current_modes():
            layout = TensorLayout.of(t)
            slot = self._slots.take(layout.nbytes)
            src = byte_view(t.untyped_storage())
            stream = self._streams["d2h"]
            copy = self._launch("d2h", layout.nbytes, stream, [self._mark()],
                                dst=slot.view, src=src)
            src.record_stream(stream)
        old = self._host.pop(tid, None)
        if old is not None:
            self._retire(old)
        self._host[tid] = _Host(layout, slot, copy, slot.view)

    def wait_offload(self, tid: int) -> None:
        """Order the compute stream after the D2H copy of ``tid`` (no host blocking)."""
        entry = self._host.get(tid)
        if entry is None:
            raise ScheduleError(f"wait for the offload of tensor {tid}, but none was started; "
                                "an Offload must come before its Wait")
        self._wait("d2h", entry.offload.end)
        entry.waited = True

    def release(self, tid: int, t: torch.Tensor, last_alias: bool) -> None:
        """Nothing to do: ``record_stream`` already keeps an in-flight source alive."""

    # -- prefetch ----------------------------------------------------------------------------
    def start_prefetch(self, tid: int, name: str) -> torch.Tensor:
        """Allocate ``tid`` on the compute stream (tracked) and queue its H2D copy."""
        self._check_open()
        entry = self._host.get(tid)
        if entry is None:
            raise ScheduleError(f"prefetch of {name!r} (tensor {tid}) but it has no host copy; "
                                "a Prefetch must follow the tensor's Offload")
        layout = entry.layout
        self.tracker.naming = name
        try:  # the one allocation the tracker must see
            raw = torch.empty(layout.nbytes, dtype=torch.uint8, device=self.device)
        except torch.cuda.OutOfMemoryError as exc:
            free, total = torch.cuda.mem_get_info(self.device)
            raise DeviceOutOfMemory(name, layout.nbytes, free, total) from exc
        storage = raw.untyped_storage()
        del raw
        with _disable_current_modes():
            dst = byte_view(storage)
            if self.poison:
                _poison(dst, layout.dtype)
            stream = self._streams["h2d"]
            copy = self._launch("h2d", layout.nbytes, stream,
                                [self._mark(), entry.offload.end], dst=dst, src=entry.source)
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
        self._wait("h2d", copy.end)

    # -- weights held in host memory (outcore.plan.weights) ---------------------------------
    def hold_on_host(self, tid: int, t: torch.Tensor, name: str = "") -> None:
        """Make ``t`` (a parameter held in host memory: a contiguous CPU tensor, pinned by
        ``outcore.runtime.host_weights.pin_parameters``) the completed host copy of
        ``tid``: no bytes move; each later prefetch copies its own bytes (a view's span,
        not its whole storage) into a device storage of exactly that size.

        Ordering: the host writes ``t`` (the optimizer step) only after every prefetch
        reading it completed (``copy_event("h2d", tid)`` or ``synchronize``), and
        prefetches are queued after those writes returned."""
        self._check_open()
        if t.device.type != "cpu" or not t.is_contiguous():
            raise OutcoreError(
                f"parameter {name or tid} is held in host memory by the schedule but is a "
                f"{'non-contiguous ' if t.device.type == 'cpu' else ''}{t.device} tensor; "
                "move it into pinned host memory first "
                "(outcore.runtime.host_weights.pin_parameters; outcore.weights.compile does)")
        with _disable_current_modes():
            source = t.detach().reshape(-1).view(torch.uint8)
            layout = TensorLayout(t.dtype, tuple(t.size()), tuple(t.stride()), 0,
                                  source.numel())
            mark = self._mark()
        old = self._host.pop(tid, None)
        if old is not None:
            self._retire(old)
        self._host[tid] = _Host(layout, None, CopyRecord("d2h", 0, mark, mark), source,
                                waited=True)

    def host_tensor(self, tid: int) -> torch.Tensor:
        """The host copy of ``tid`` with its layout (a view of pinned memory, no copy). Its
        Wait(d2h) must have been issued (ScheduleError otherwise); that Wait does not block
        the host, so read the bytes only after ``copy_event("d2h", tid)`` completed (or
        after ``synchronize``)."""
        entry = self._host.get(tid)
        if entry is None or not entry.waited:
            raise ScheduleError(f"tensor {tid} has no completed host copy to read; Wait(d2h) "
                                "for its Offload first")
        return view_bytes(entry.source, entry.layout)

    def copy_event(self, direction: Direction, tid: int) -> Event:
        """The end event of the latest copy of ``tid`` in ``direction`` (its offload, or
        its latest prefetch): host code that reads a host copy, or writes one a prefetch
        reads, synchronizes on it first."""
        if direction == "d2h":
            entry = self._host.get(tid)
            if entry is None:
                raise ScheduleError(f"tensor {tid} has no host copy")
            return entry.offload.end
        copy = self._prefetches.get(tid)
        if copy is None:
            raise ScheduleError(f"tensor {tid} has no prefetch")
        return copy.end

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
        self._slots.waiting.reclaim(block=False)
        self._ledger.fold()

    def host_bytes(self) -> int:
        return sum(e.layout.nbytes for e in self._host.values())

    def stats(self) -> TransferStats:
        """Bytes, copy-stream busy seconds and compute-stream stall seconds (``blocked_s``)
        of the completed copies and Waits, from CUDA timing events (zero with
        ``timing=False``, except bytes and copies)."""
        return self._ledger.snapshot()

    def reset_stats(self) -> None:
        self._ledger.fold()
        self._ledger.reset()

    def close(self) -> None:
        """Wait for the copies in flight, give the host slots back and unpin the pool; the
        device cannot be used after (make a new one)."""
        self._closed = True
        self.synchronize()
        for tid in list(self._host):
            self.drop_host(tid)
        self._slots.drain()
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise OutcoreError(f"the {self.name} device is closed; make a new one")

    def _event(self) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=self.timing)

    def _mark(self) -> torch.cuda.Event:
        """An event at the current point of the compute stream."""
        event = torch.cuda.Event()
        event.record(self.compute_stream)
        return event

    def _wait(self, direction: Direction, end: Event) -> None:
        compute = self.compute_stream
        if not self.timing:
            compute.wait_event(end)  # type: ignore[arg-type]
            return
        before, after = self._event(), self._event()
        before.record(compute)
        compute.wait_event(end)  # type: ignore[arg-type]
        after.record(compute)
        self._ledger.waited(WaitRecord(direction, before, after))

    def _launch(self, direction: Direction, nbytes: int, stream: torch.cuda.Stream,
                after: list[Event], dst: torch.Tensor, src: torch.Tensor) -> CopyRecord:
        for event in after:
            stream.wait_event(event)  # type: ignore[arg-type]
        start, end = self._event(), self._event()
        with torch.cuda.stream(stream):
            if self.copy_delay_cycles:
                torch.cuda._sleep(self.copy_delay_cycles)
            start.record(stream)
            dst.copy_(src, non_blocking=True)
            end.record(stream)
        copy = CopyRecord(direction, nbytes, start, end)
        self._ledger.copied(copy)
        return copy

    def _retire(self, entry: _Host) -> None:
        if entry.slot is not None:  # a held parameter's bytes are the parameter's own
            self._slots.give_back(entry.slot, [entry.offload.end, *entry.readers])


def view_bytes(flat: torch.Tensor, layout: TensorLayout) -> torch.Tensor:
    """A tensor with ``layout`` over the bytes of ``flat`` (a flat uint8 tensor, possibly a
    range of a larger storage, e.g. a host slot). The tensor gets a storage of its own over
    exactly those bytes (an ``UntypedStorage`` slice shares the memory and keeps the whole
    alive), so ``as_strided`` offsets on it count from ``flat``'s first byte, as on a
    device whose host copies have storages of their own."""
    base = int(flat.storage_offset())
    return layout.view(flat.untyped_storage()[base:base + flat.numel()])


def _release_pool(pool: HostPool, device: torch.device) -> None:
    """Wait for every copy on the device, then unpin and drop the pool's segments."""
    with contextlib.suppress(RuntimeError):  # CUDA torn down at exit: nothing in flight
        torch.cuda.synchronize(device)
    pool.close()


def _poison(flat: torch.Tensor, dtype: torch.dtype) -> None:
    """Fill a fresh device buffer with values no computation produces (NaN for floats)."""
    if dtype.is_floating_point and flat.numel() % dtype.itemsize == 0:
        flat.view(dtype).fill_(float("nan"))
    else:
        flat.fill_(0xFF)
