"""The device interface the executor runs a Schedule against.

A device owns (1) the accounting of device memory, through a ``MemoryTracker`` that the
executor enters around the step, and (2) the host store and the copy engines. Offloaded
data is keyed by the graph's tensor id, never by a storage address (addresses are reused).

Contract, in schedule terms:

* ``start_offload(tid, t)``: begin copying ``t`` to the host; returns at once.
* ``wait_offload(tid)``: block until that copy is complete; after it, freeing ``t`` is safe.
* ``release(tid, t, last_alias)``: the executor is about to drop ``t``. Devices that model
  memory reuse may overwrite the storage here when ``last_alias`` is true (the emulated
  device does, to make a free-before-copy race visible).
* ``start_prefetch(tid, name)``: allocate a device tensor (counted by the tracker, so it may
  raise DeviceOutOfMemory) and begin filling it from the host copy; returns that tensor.
* ``wait_prefetch(tid)``: block until the tensor returned by ``start_prefetch`` is filled.
* ``drop_host(tid)``: forget the host copy (end of step).
* ``synchronize()``: wait for every copy in flight.
* ``close()``: end of the device's use: wait for copies in flight and let go of what it
  holds (copy threads, host memory). Devices with nothing to let go of make it a no-op.

``capacity`` (bytes, None: unbounded) is read-only to callers: the executor reads it to size
its per-step ``MemoryTracker``; devices may expose it as a property of their own tracker.
``tracker_is_memory``: True where the tracker's count *is* the device's memory (the emulated
device: every step runs under the tracker); False on a real device (the plain CPU, CUDA), where
the tracker checks the budget, so the executor need not count again the steps of a schedule
whose peak a counted step already proved (``Executor.needs_measuring``). A device without
the attribute is counted on every step.
``stats()`` returns the transfer statistics since creation (``TransferStats``; the executor
subtracts two of them for one step), or None on a device that keeps none.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, runtime_checkable

import torch

from outcore.runtime.devices.stats import TransferStats
from outcore.runtime.tracker import MemoryTracker


@runtime_checkable
class Device(Protocol):
    name: str
    tracker: MemoryTracker

    @property
    def capacity(self) -> int | None: ...
    def start_offload(self, tid: int, t: torch.Tensor) -> None: ...
    def wait_offload(self, tid: int) -> None: ...
    def release(self, tid: int, t: torch.Tensor, last_alias: bool) -> None: ...
    def start_prefetch(self, tid: int, name: str) -> torch.Tensor: ...
    def wait_prefetch(self, tid: int) -> None: ...
    def drop_host(self, tid: int) -> None: ...
    def synchronize(self) -> None: ...
    def host_bytes(self) -> int: ...
    def stats(self) -> TransferStats | None: ...
    def close(self) -> None: ...


class SyncCPUDevice:
    """The plain CPU: copies happen synchronously on the caller's thread.

    Device memory is accounted by the tracker (optionally bounded by ``capacity``); the host
    store is a dict of CPU tensors keyed by tensor id, made outside the tracker.
    """

    name = "cpu"
    #: the host's RAM is this device's memory; the tracker checks the budget on it
    tracker_is_memory = False

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.tracker = MemoryTracker(capacity)
        self._host: dict[int, torch.Tensor] = {}

    def start_offload(self, tid: int, t: torch.Tensor) -> None:
        with untracked():
            self._host[tid] = t.detach().clone()

    def wait_offload(self, tid: int) -> None:
        if tid not in self._host:
            raise KeyError(f"no offload of tensor {tid} was started")

    def release(self, tid: int, t: torch.Tensor, last_alias: bool) -> None:
        return None

    def start_prefetch(self, tid: int, name: str) -> torch.Tensor:
        host = self._host[tid]
        self.tracker.naming = name
        out = torch.empty_strided(host.size(), host.stride(), dtype=host.dtype)
        out.copy_(host)
        return out

    def wait_prefetch(self, tid: int) -> None:
        return None

    def drop_host(self, tid: int) -> None:
        self._host.pop(tid, None)

    def hold_on_host(self, tid: int, t: torch.Tensor) -> None:
        """``t`` (a parameter held in host memory) is the host copy of ``tid``; no copy."""
        self._host[tid] = t.detach()

    def host_tensor(self, tid: int) -> torch.Tensor:
        """The host copy of ``tid`` (after its offload was waited for)."""
        return self._host[tid]

    def synchronize(self) -> None:
        return None

    def host_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self._host.values())

    def stats(self) -> TransferStats | None:
        """None: synchronous copies keep no transfer statistics."""
        return None

    def close(self) -> None:
        """Nothing to let go of: copies are synchronous and the host store is a plain dict."""


class untracked:
    """Run a block with no dispatch mode active (host-side work is not device memory)."""

    def __enter__(self) -> None:
        from torch.utils._python_dispatch import _disable_current_modes

        self._ctx = _disable_current_modes()
        self._ctx.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._ctx.__exit__(exc_type, exc, tb)
