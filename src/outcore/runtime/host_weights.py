"""The device side of parameters held in host memory and gradients sent there.

A schedule with ``host_static`` parameters (``outcore.plan.weights``) needs, before the step,
a completed host copy of each: the live parameter itself is that copy (``hold_on_host``; no
bytes are copied, the optimizer's in-place updates are seen by the next step's prefetch).
A gradient of ``host_outputs`` is read back from the host copy of its storage after its
offload was waited for (``host_tensor``). Devices that support this have the two methods
``hold_on_host(tid, tensor)`` and ``host_tensor(tid)``: the plain CPU and the CPU-emulated
accelerator. On CUDA the captured step's parameters are device tensors; holding them in
pinned host memory is not implemented yet, and ``check_host_weights`` says so.
"""

from __future__ import annotations

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
