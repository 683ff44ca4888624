"""A CPU-emulated accelerator: a byte budget for device memory and a real copy engine.

Device memory is the CPU tensors the executor makes while the device's ``tracker`` (a
``MemoryTracker``) is active on the compute thread; with ``capacity`` set, an allocation
past it raises ``DeviceOutOfMemory``. Host memory is separate: host copies are allocated
and filled on the copy-engine threads, where the compute thread's dispatch modes are not
active, so the tracker never counts them.

Copies run on two ``CopyEngine`` threads (D2H and H2D), FIFO per direction, each copy
taking ``(latency_s + bytes / bandwidth) * slowdown`` seconds and moving its bytes chunk by
chunk over that time. Invariants:

* The host store is keyed by graph tensor id, never by a storage address. A host copy
  holds the storage's raw bytes plus the tensor's layout (dtype, size, stride, offset), so
  a prefetch rebuilds a tensor bit-identical to the one offloaded, views and all.
* A D2H copy keeps the source storage referenced until it finishes; ``release`` of that
  storage while the copy is in flight overwrites it (``poison_on_release``), emulating the
  memory being handed to the next allocation, so a missing Wait corrupts the host copy
  visibly instead of passing by luck.
* A prefetched tensor is allocated on the calling thread (counted by the tracker, named
  ``name``) and, with ``poison_on_release``, filled with poison before the H2D copy starts,
  so reading it before ``wait_prefetch`` sees poison rather than stale memory.
* An H2D copy starts only after the D2H copy of the same tensor has completed.
* Errors on a copy thread are re-raised as ``CopyError`` by the wait (or ``synchronize``)
  that covers the copy, naming the tensor.
"""

from __future__ import annotations

import time
import weakref
from functools import partial
from typing import Self

import torch

from outcore.errors import OutcoreError, ScheduleError
from outcore.runtime.devices.copy_engine import (
    CopyEngine,
    CopyJob,
    Direction,
    LinkModel,
)
from outcore.runtime.devices.stats import StatsRecorder, TransferStats
from outcore.runtime.devices.storage import TensorLayout, byte_view, poison_storage
from outcore.runtime.tracker import MemoryTracker

#: Above this many finished jobs, the pending list is pruned at the next submit.
_PRUNE_AT = 256


class _HostEntry:
    """The host copy of one tensor: its layout, the D2H job filling it, and the buffer."""

    def __init__(self, layout: TensorLayout) -> None:
        self.layout = layout
        self.buffer: torch.Tensor | None = None
        self.job: CopyJob | None = None

    def allocate(self) -> torch.Tensor:
        """Allocate the host buffer (engine thread)."""
        self.buffer = allocate_host(self.layout.nbytes)
        return self.buffer

    def read(self) -> torch.Tensor:
        """The filled host buffer (engine thread, after the D2H job completed)."""
        if self.buffer is None:
            raise OutcoreError("the host copy was never allocated")
        return self.buffer


def allocate_host(nbytes: int) -> torch.Tensor:
    """A flat uint8 host buffer of ``nbytes`` (a seam: tests make it fail)."""
    return torch.empty(nbytes, dtype=torch.uint8)


class EmulatedDevice:
    """An accelerator emulated on the CPU; see the module docstring for the model.

    Args:
        capacity: device memory in bytes (None: unbounded, still counted).
        bandwidth_d2h, bandwidth_h2d: link bandwidth per direction, bytes per second.
        latency_s: fixed cost per copy, seconds.
        slowdown: multiplies every copy's duration (> 1 slows the engine to expose races).
        poison_on_release: overwrite storages released during a copy, and fresh prefetch
            buffers, with poison (see ``poison_storage``).
        emulates: the GPU profile whose host link the bandwidths were scaled from
            (``make_device(..., gpu=)``); None when they were given as bytes/s. Only such a
            link is recalibrated to the model it runs (``link_calibration``).
    """

    name = "cpu-emulated"
    #: the emulated memory is the tracker's count: every step is counted (and enforced)
    tracker_is_memory = True

    def __init__(self, capacity: int | None, bandwidth_d2h: float, bandwidth_h2d: float,
                 latency_s: float = 0.0, slowdown: float = 1.0,
                 poison_on_release: bool = True, emulates: str | None = None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0 bytes or None, got {capacity}")
        self.tracker = MemoryTracker(capacity)
        self.poison_on_release = poison_on_release
        self.emulates = emulates
        #: (d2h, h2d) shares of the emulated GPU's link this device gets (data-parallel
        #: ranks sharing one host link); a recalibrated link keeps them
        self.link_share = (1.0, 1.0)
        self._stats = StatsRecorder()
        self._engines: dict[str, CopyEngine] = {
            "d2h": CopyEngine("d2h", LinkModel(bandwidth_d2h, latency_s, slowdown),
                              self._stats.copied),
            "h2d": CopyEngine("h2d", LinkModel(bandwidth_h2d, latency_s, slowdown),
                              self._stats.copied),
        }
        self._host: dict[int, _HostEntry] = {}
        self._prefetches: dict[int, CopyJob] = {}
        self._pending: list[CopyJob] = []
        self._closed = False
        # The engines do not refer back to the device, so this fires if it is dropped unclosed.
        self._finalizer = weakref.finalize(self, _close_engines, list(self._engines.values()))

    @property
    def capacity(self) -> int | None:
        return self.tracker.capacity

    def link(self, direction: Direction) -> LinkModel:
        """The time model of one direction's copy engine."""
        return self._engines[direction].link

    # -- offload -----------------------------------------------------------------------------
    def start_offload(self, tid: int, t: torch.Tensor, name: str = "") -> None:
        """Queue a D2H copy of ``t``'s whole storage; replaces any earlier host copy of tid."""
        self._check_open()
        if t.device.type != "cpu":
            raise ValueError(
                f"tensor {name or tid} is on {t.device}; the emulated device holds CPU tensors")
        layout = TensorLayout.of(t)
        storage = t.untyped_storage()
        entry = _HostEntry(layout)
        job = CopyJob(tid, name, "d2h", layout.nbytes, source=partial(byte_view, storage),
                      dest=entry.allocate, reads=storage._cdata)
        entry.job = job
        self._host[tid] = entry
        self._submit(job)

    def wait_offload(self, tid: int) -> None:
        """Block until the D2H copy of ``tid`` is complete; raise CopyError if it failed."""
        entry = self._host.get(tid)
        if entry is None or entry.job is None:
            raise ScheduleError(f"wait for the offload of tensor {tid}, but none was started; "
                                "an Offload must come before its Wait")
        self._wait(entry.job)

    def release(self, tid: int, t: torch.Tensor, last_alias: bool) -> None:
        """Poison ``t``'s storage if it is the last alias and a D2H copy still reads it."""
        if not (self.poison_on_release and last_alias):
            return
        key = t.untyped_storage()._cdata
        for job in self._pending:
            if job.direction == "d2h" and job.reads == key and not job.done.is_set():
                self._stats.release_during_copy()
                poison_storage(t.untyped_storage(), t.dtype)
                return

    # -- prefetch ----------------------------------------------------------------------------
    def start_prefetch(self, tid: int, name: str) -> torch.Tensor:
        """Allocate the device tensor for ``tid`` (tracked, may raise DeviceOutOfMemory) and
        queue its H2D copy; the tensor must not be read before ``wait_prefetch(tid)``."""
        self._check_open()
        entry = self._host.get(tid)
        if entry is None or entry.job is None:
            raise ScheduleError(f"prefetch of {name!r} (tensor {tid}) but it has no host copy; "
                                "a Prefetch must follow the tensor's Offload")
        layout = entry.layout
        self.tracker.naming = name
        raw = torch.empty(layout.nbytes, dtype=torch.uint8)  # the device allocation
        storage = raw.untyped_storage()
        del raw
        if self.poison_on_release:
            poison_storage(storage, layout.dtype)
        out = layout.view(storage)
        job = CopyJob(tid, name, "h2d", layout.nbytes, source=entry.read,
                      dest=partial(byte_view, storage), after=entry.job)
        self._prefetches[tid] = job
        self._submit(job)
        return out

    def wait_prefetch(self, tid: int) -> None:
        """Block until the H2D copy of ``tid`` is complete; raise CopyError if it failed."""
        job = self._prefetches.get(tid)
        if job is None:
            raise ScheduleError(f"wait for the prefetch of tensor {tid}, but none was started; "
                                "a Prefetch must come before its Wait")
        self._wait(job)

    # -- weights held in host memory (outcore.plan.weights) ---------------------------------
    def hold_on_host(self, tid: int, t: torch.Tensor, name: str = "") -> None:
        """Make ``t``'s storage the completed host copy of ``tid`` (a parameter held in host
        memory between steps): no bytes move; a later prefetch copies from it."""
        self._check_open()
        entry = _HostEntry(TensorLayout.of(t))
        entry.buffer = byte_view(t.untyped_storage())
        job = CopyJob(tid, name, "d2h", entry.layout.nbytes, source=None, dest=None)
        job.done.set()
        entry.job = job
        self._host[tid] = entry

    def host_tensor(self, tid: int) -> torch.Tensor:
        """The host copy of ``tid`` with the layout it was offloaded with; its offload must
        have been waited for (``wait_offload``)."""
        entry = self._host.get(tid)
        if entry is None or entry.job is None or not entry.job.done.is_set():
            raise ScheduleError(f"tensor {tid} has no completed host copy to read; Wait(d2h) "
                                "for its Offload first")
        entry.job.check()
        return entry.layout.view(entry.read().untyped_storage())

    # -- housekeeping ------------------------------------------------------------------------
    def drop_host(self, tid: int) -> None:
        """Forget the host copy of ``tid`` (copies already queued still complete)."""
        self._host.pop(tid, None)
        self._prefetches.pop(tid, None)

    def synchronize(self) -> None:
        """Wait for every copy in flight; raise the first failure among them."""
        pending, self._pending = self._pending, []
        first: CopyJob | None = None
        for job in pending:
            self._block_on(job)
            if job.error is not None and first is None:
                first = job
        if first is not None:
            first.check()

    def host_bytes(self) -> int:
        """Bytes held by host copies (including those still being filled)."""
        return sum(e.layout.nbytes for e in self._host.values())

    def stats(self) -> TransferStats:
        """Bytes, busy and blocked seconds per direction since creation or ``reset_stats``."""
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats.reset()

    def close(self) -> None:
        """Stop the copy threads; copies still running or queued fail with CopyError."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_slowdown(self, slowdown: float) -> None:
        """Change both engines' ``slowdown`` for the copies submitted from now on (stress
        tests vary the link's speed between steps)."""
        for engine in self._engines.values():
            link = engine.link
            engine.link = LinkModel(link.bandwidth, link.latency_s, slowdown)

    def set_bandwidth(self, d2h: float, h2d: float, emulates: str | None = None) -> None:
        """Set each direction's link bandwidth (bytes/s) for the copies from now on; latency
        and slowdown are kept; ``emulates``, when given, names the GPU profile the new link
        stands for. Only between steps: a queued copy would otherwise run at a speed it was
        not issued at.

        Raises:
            OutcoreError: a copy is in flight (call ``synchronize`` first).
            ValueError: a bandwidth that is not > 0.
        """
        if self.in_flight():
            raise OutcoreError(f"{self.in_flight()} copies are in flight; change the link "
                               "between steps (after synchronize())")
        for direction, bandwidth in (("d2h", d2h), ("h2d", h2d)):
            engine = self._engines[direction]
            link = engine.link
            engine.link = LinkModel(float(bandwidth), link.latency_s, link.slowdown)
        if emulates is not None:
            self.emulates = emulates

    def in_flight(self) -> int:
        """Copies submitted and not yet finished (0 after ``synchronize`` or a failed step)."""
        return sum(1 for job in self._pending if not job.done.is_set())

    @property
    def threads_running(self) -> bool:
        """Whether any copy-engine thread is alive."""
        return any(e.running for e in self._engines.values())

    # -- internals ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise OutcoreError(f"the {self.name} device is closed; make a new one")

    def _submit(self, job: CopyJob) -> None:
        if len(self._pending) > _PRUNE_AT:
            self._pending = [j for j in self._pending if not j.done.is_set() or j.error]
        self._pending.append(job)
        self._engines[job.direction].submit(job)

    def _block_on(self, job: CopyJob) -> None:
        if not job.done.is_set():
            t0 = time.perf_counter()
            job.done.wait()
            t1 = time.perf_counter()
            late = t1 - job.deadline if job.error is None else 0.0
            self._stats.blocked(job.direction, t1 - t0, max(0.0, late))

    def _wait(self, job: CopyJob) -> None:
        self._block_on(job)
        if job.error is not None:  # reported here, so synchronize() will not raise it again
            self._pending = [j for j in self._pending if j is not job]
        job.check()


def _close_engines(engines: list[CopyEngine]) -> None:
    for engine in engines:
        engine.close()
