"""The device side of parameters held in host memory and gradients sent there.

A schedule with ``host_static`` parameters (``outcore.plan.weights``) needs, before the step,
a completed host copy of each: the live parameter itself is that copy (``hold_on_host``; no
bytes are copied, the optimizer's in-place updates are seen by the next step's prefetch).
A gradient of ``host_outputs`` is read back from the host copy of its storage after its
offload was waited for (``host_tensor``). Devices that support this have the two methods
``hold_on_host(tid, tensor)`` and ``host_tensor(tid)``: the plain CPU and the CPU-emulated
accelerator. On CUDA the captured step's parameters are device tensors; holding them in
pinned host memory is not implemented yet, and ``check_host_weights`` says so.

``LandingDevice`` wraps such a device and reports every copy the step has waited for
(``landed(direction, tid)``, called on the step's thread right after ``wait_offload`` or
``wait_prefetch`` returned; ``("h2d-start", tid)`` before a prefetch starts): what the
overlapped optimizer step (``outcore.weights.host_step``) starts host work from. It adds
no instruction and moves no byte; everything else is the wrapped device's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from outcore.errors import OutcoreError


def check_host_weights(device: Any) -> None:
    """Raise OutcoreError, before anything runs, when ``device`` cannot hold weights on host."""
    if not (hasattr(device, "hold_on_host") and hasattr(device, "host_tensor")):
        raise OutcoreError(
            f"the schedule holds parameters or gradients in host memory, which device "
            f"{getattr(device, 'name', type(device).__name__)!r} does not support yet; run it "
            "on device='cpu-emulated' (or 'cpu'), or plan without host-held weights")


def hold_on_host(device: Any, tid: int, tensor: torch.Tensor) -> None:
    """Register ``tensor`` (a parameter) as the completed host copy of tensor ``tid``."""
    device.hold_on_host(tid, tensor)


def host_tensor(device: Any, tid: int) -> torch.Tensor:
    """The completed host copy of storage ``tid``, with the layout it was offloaded with."""
    out = device.host_tensor(tid)
    assert isinstance(out, torch.Tensor)
    return out


class LandingDevice:
    """``device``, calling ``landed("d2h"|"h2d", tid)`` after each completed Wait."""

    def __init__(self, device: Any, landed: Callable[[str, int], None]) -> None:
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "landed", landed)

    def wait_offload(self, tid: int) -> None:
        self.device.wait_offload(tid)
        self.landed("d2h", tid)

    def wait_prefetch(self, tid: int) -> None:
        self.device.wait_prefetch(tid)
        self.landed("h2d", tid)

    def start_prefetch(self, tid: int, name: str) -> Any:
        self.landed("h2d-start", tid)
        return self.device.start_prefetch(tid, name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)

    def __setattr__(self, name: str, value: Any) -> None:  # e.g. the executor's tracker
        setattr(self.device, name, value)
