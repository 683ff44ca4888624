"""The device side of parameters held in host memory and gradients sent there.

A schedule with ``host_static`` parameters (``outcore.plan.weights``) needs, before the step,
a completed host copy of each: the live parameter itself is that copy (``hold_on_host``; no
bytes are copied, the optimizer's in-place updates are seen by the next step's prefetch).
A gradient of ``host_outputs`` is read back from the host copy of its storage after its
offload was waited for (``host_tensor``). Devices that support this have the two methods
``hold_on_host(tid, tensor)`` and ``host_tensor(tid)``: the plain CPU, the CPU-emulated
accelerator and CUDA. On CUDA a held parameter must first move into pinned host memory
(``pin_parameters``: one page-locked segment, each parameter a contiguous 64-byte-aligned
range of it), and a Wait does not block the host: host code reading a host copy or writing
a held parameter waits for ``copy_event`` first (None on devices whose Waits block).

``LandingDevice`` wraps such a device and reports every copy the step has waited for
(``landed(direction, tid)``, called on the step's thread right after ``wait_offload`` or
``wait_prefetch`` returned; ``("h2d-start", tid)`` before a prefetch starts): what the
overlapped optimizer step (``outcore.weights.host_step``) starts host work from. It adds
no instruction and moves no byte; everything else is the wrapped device's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from outcore.errors import OutcoreError

#: Alignment of each parameter in the pinned segment (the CUDA host pool's, a cache line).
PIN_ALIGNMENT = 64


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


def copy_event(device: Any, direction: str, tid: int) -> Any:
    """The event the host must wait for before it reads the host copy of ``tid``
    (``"d2h"``: its offload landed) or writes a held parameter (``"h2d"``: its latest
    prefetch finished reading it); None on a device whose Waits already block the host."""
    get = getattr(device, "copy_event", None)
    return None if get is None else get(direction, tid)


def pinned_bytes(params: Sequence[torch.Tensor], alignment: int = PIN_ALIGNMENT) -> int:
    """Bytes of the one segment ``pin_parameters`` makes for ``params``."""
    return sum(-(-p.numel() * p.element_size() // alignment) * alignment for p in params)


@torch.no_grad()
def pin_parameters(params: Sequence[torch.Tensor], pin: Callable[[int], torch.Tensor],
                   optimizer: torch.optim.Optimizer | None = None,
                   alignment: int = PIN_ALIGNMENT) -> torch.Tensor | None:
    """Move ``params`` (``nn.Parameter``s, on any device) into one host segment of
    ``pinned_bytes(params)`` bytes from ``pin(nbytes)`` (a flat uint8 tensor, e.g.
    ``cuda.pin_exact``): each becomes a contiguous view of its own ``alignment``-aligned
    range (``param.data`` is replaced, so optimizers and modules holding the parameter
    see it; values are copied exactly). Optimizer state tensors of those parameters
    (``optimizer.state``) move to the host with them. Returns the segment (None when
    ``params`` is empty): the caller unpins it when done (the parameters keep the memory,
    unpinned, after that)."""
    params = list(params)
    if not params:
        return None
    segment = pin(pinned_bytes(params, alignment))
    offset = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        flat = segment[offset:offset + nbytes].view(p.dtype)
        host = flat.view(p.shape)
        host.copy_(p.detach())
        p.data = host
        offset += -(-nbytes // alignment) * alignment
        if optimizer is not None:
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    state[key] = value.to("cpu")
    return segment


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
