"""Peak-live-bytes tracker, independent of the planner.

``MemoryTracker`` is a TorchDispatchMode that sees every op's outputs. Each new storage is
counted once, keyed by its StorageImpl, and un-counted by a weak reference's callback on the
storage's Python object (PyTorch preserves that object for the storage's whole life, so the
callback fires exactly when the memory is released). Host copies made on other threads are
not seen: dispatch modes are thread-local.

With ``capacity`` set, an allocation that would exceed it raises DeviceOutOfMemory, naming
the tensor being made (``tracker.naming``) and the bytes wanted and free; this is how the
emulated device enforces its memory size.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from outcore.errors import DeviceOutOfMemory


class MemoryTracker(TorchDispatchMode):
    """Counts live device bytes; ``peak`` is the high-water mark since the last reset."""

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        self.capacity = capacity
        self.live = 0
        self.peak = 0
        self.allocations = 0
        self.naming = ""
        self._tracked: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}  # StorageImpl -> weak ref whose callback un-counts
        self._lock = threading.Lock()

    # -- accounting --------------------------------------------------------------------------
    def track(self, tensors: Iterable[Any], name: str = "") -> None:
        """Count the storages of ``tensors`` (those made outside the mode, e.g. the inputs)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t.untyped_storage(), name or self.naming)

    def _add(self, storage: torch.UntypedStorage, name: str) -> None:
        key = storage._cdata
        if key in self._tracked:
            return
        nbytes = storage.nbytes()
        with self._lock:
            if self.capacity is not None and self.live + nbytes > self.capacity:
                raise DeviceOutOfMemory(name or "<unnamed>", nbytes,
                                        self.capacity - self.live, self.capacity)
            self._tracked[key] = nbytes
            self.live += nbytes
            self.allocations += 1
            if self.live > self.peak:  # noqa: PLR1730 - per allocation: cheaper than max()
                self.peak = self.live
            self._refs[key] = weakref.ref(storage, self._releaser(key))

    def _releaser(self, key: int) -> Callable[[weakref.ref[torch.UntypedStorage]], None]:
        """The weak-reference callback that un-counts the storage keyed ``key``."""

        def release(_ref: weakref.ref[torch.UntypedStorage]) -> None:
            self._release(key)
        return release

    def _release(self, key: int) -> None:
        with self._lock:
            nbytes = self._tracked.pop(key, 0)
            self.live -= nbytes
            self._refs.pop(key, None)

    def close(self) -> None:
        """Stop watching storages: drop the weak references still pending (e.g. on
        parameters, which outlive the step); a dropped reference never calls back, so nothing
        keeps this tracker alive."""
        with self._lock:
            self._refs.clear()

    def reset_peak(self) -> None:
        """Start a new high-water mark at the current live bytes."""
        self.peak = self.live

    # -- dispatch ----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        try:
            if isinstance(out, torch.Tensor):
                self._add(out.untyped_storage(), self.naming)
            else:
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        self._add(t.untyped_storage(), self.naming)
        except DeviceOutOfMemory:
            del out  # give the memory back before reporting
            raise
        return out
