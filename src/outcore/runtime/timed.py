"""A Device wrapper that marks the time of every call the generated step makes to it.

``TimedDevice(device, marks)`` is a ``Device``: each copy call (``start_offload``,
``wait_offload``, ``release``, ``start_prefetch``, ``wait_prefetch``) appends
``time.perf_counter()`` to ``marks`` and then delegates; everything else delegates
unchanged. With ``Runtime.begin`` marking each Compute, a timed step gets exactly one mark per
instruction, in order (codegen emits one runtime call per instruction).
"""

from __future__ import annotations

import time

import torch

from outcore.runtime.devices.base import Device
from outcore.runtime.devices.stats import TransferStats
from outcore.runtime.tracker import MemoryTracker


class TimedDevice:
    """``device`` with a time mark before each copy call (module doc)."""

    def __init__(self, device: Device, marks: list[float]) -> None:
        self.device = device
        self.marks = marks
        self.name = f"timed {device.name}"

    @property
    def tracker(self) -> MemoryTracker:
        return self.device.tracker

    @tracker.setter
    def tracker(self, tracker: MemoryTracker) -> None:
        self.device.tracker = tracker

    @property
    def capacity(self) -> int | None:
        return self.device.capacity

    def start_offload(self, tid: int, t: torch.Tensor) -> None:
        self.marks.append(time.perf_counter())
        self.device.start_offload(tid, t)

    def wait_offload(self, tid: int) -> None:
        self.marks.append(time.perf_counter())
        self.device.wait_offload(tid)

    def release(self, tid: int, t: torch.Tensor, last_alias: bool) -> None:
        self.marks.append(time.perf_counter())
        self.device.release(tid, t, last_alias)

    def start_prefetch(self, tid: int, name: str) -> torch.Tensor:
        self.marks.append(time.perf_counter())
        return self.device.start_prefetch(tid, name)

    def wait_prefetch(self, tid: int) -> None:
        self.marks.append(time.perf_counter())
        self.device.wait_prefetch(tid)

    def drop_host(self, tid: int) -> None:
        self.device.drop_host(tid)

    def synchronize(self) -> None:
        self.device.synchronize()

    def host_bytes(self) -> int:
        return self.device.host_bytes()

    def stats(self) -> TransferStats | None:
        return self.device.stats()

    def close(self) -> None:
        self.device.close()
