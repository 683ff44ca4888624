"""Measure what a Wait costs the compute thread on the CPU-emulated device.

The emulated copy engine keeps its link's timeline exactly (see ``copy_engine``): a copy
ends at its modelled ``deadline``. What the model cannot know is how long after that the
compute thread, blocked in a Wait, runs again (the engine thread wakes at the deadline,
signals, and the waiting thread wakes in turn), nor what a Wait on a copy that has already
ended costs. ``calibrate_waits`` measures both on a private device with the given link,
as the simulator's ``HostCosts.wake`` and ``HostCosts.wait``.

Invariants: the figures are medians over ``samples`` copies, never negative; the device
is closed on return, also on error.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from outcore.runtime.devices.emulated import EmulatedDevice
from outcore.runtime.tracker import MemoryTracker


@dataclass(frozen=True)
class WaitCalibration:
    """Seconds: ``wake`` from a copy's deadline to the return of the Wait blocked on it;
    ``wait`` for a Wait on a copy that had already ended; ``samples`` copies each."""

    wake: float
    wait: float
    samples: int


def calibrate_waits(latency_s: float = 2e-4, copy_seconds: float = 2e-3,
                    samples: int = 30) -> WaitCalibration:
    """Time ``samples`` blocking and ``samples`` non-blocking Waits on offloads of 1 MiB
    through a link that takes ``latency_s + copy_seconds`` per copy."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not copy_seconds > 0:
        raise ValueError(f"copy_seconds must be > 0, got {copy_seconds}")
    data = torch.zeros(1 << 18)  # 1 MiB of float32
    bandwidth = data.numel() * data.element_size() / copy_seconds
    late: list[float] = []
    check: list[float] = []
    with EmulatedDevice(None, bandwidth, bandwidth, latency_s=latency_s) as device:
        device.tracker = MemoryTracker()
        for i in range(2 * samples):
            device.start_offload(i, data)
            job = device._host[i].job  # the deadline is the engine's own
            assert job is not None
            if i % 2 == 0:  # blocking: wait right away
                device.wait_offload(i)
                late.append(time.perf_counter() - job.deadline)
            else:  # non-blocking: let the copy end first
                job.done.wait()
                start = time.perf_counter()
                device.wait_offload(i)
                check.append(time.perf_counter() - start)
            device.drop_host(i)
    return WaitCalibration(wake=max(0.0, statistics.median(late)),
                           wait=max(0.0, statistics.median(check)), samples=samples)
