"""``make_device``: build a Device from its name and options.

"cpu" is the plain synchronous CPU (``SyncCPUDevice``), "cpu-emulated" an accelerator
emulated on the CPU with a timed copy engine (``EmulatedDevice``), "cuda" a real GPU
(``CudaDevice``). Options that do not apply to the chosen device are refused rather than
ignored, so a typo cannot silently run a different experiment.
"""

from __future__ import annotations

from outcore.runtime.devices.base import Device, SyncCPUDevice
from outcore.units import parse_bytes

DEVICES = ("cpu", "cpu-emulated", "cuda")
#: The GPU the emulated device stands in for when neither ``gpu`` nor ``bandwidth`` is given.
DEFAULT_GPU = "v100-pcie"


def make_device(device: str, *, capacity: int | str | None = None, gpu: str | None = None,
                bandwidth: float | tuple[float, float] | None = None,
                slowdown: float = 1.0) -> Device:
    """Return the device named ``device``.

    Args:
        device: one of ``DEVICES``.
        capacity: device memory, bytes or a string such as "4GB" (None: unbounded).
        gpu: cpu-emulated only: the GPU profile whose compute/transfer ratio to keep
            (see ``bandwidth.bandwidth_for_gpu``; a Trainer recalibrates it to the model
            it runs, ``link_calibration``); default ``DEFAULT_GPU``.
        bandwidth: cpu-emulated only: link bytes/s, one number for both directions or a
            (d2h, h2d) pair; excludes ``gpu``.
        slowdown: cpu-emulated only: multiplies copy durations (> 1 to expose races).
    """
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    cap = None if capacity is None else parse_bytes(capacity)
    if device != "cpu-emulated":
        given = [k for k, v in (("gpu", gpu), ("bandwidth", bandwidth)) if v is not None]
        if slowdown != 1.0:
            given.append("slowdown")
        if given:
            raise ValueError(f"{', '.join(given)} only apply to device='cpu-emulated', "
                             f"not {device!r}")
    if device == "cpu":
        return SyncCPUDevice(cap)
    if device == "cuda":
        from outcore.runtime.devices.cuda import CudaDevice

        return CudaDevice(cap)
    from outcore.runtime.devices.emulated import EmulatedDevice

    d2h, h2d = _emulated_bandwidth(gpu, bandwidth)
    emulates = (gpu or DEFAULT_GPU) if bandwidth is None else None
    return EmulatedDevice(cap, d2h, h2d, slowdown=slowdown, emulates=emulates)


def _emulated_bandwidth(gpu: str | None,
                        bandwidth: float | tuple[float, float] | None) -> tuple[float, float]:
    if gpu is not None and bandwidth is not None:
        raise ValueError("give either gpu= (bandwidth scaled from a GPU profile) or "
                         "bandwidth= (bytes/s), not both")
    if bandwidth is None:
        from outcore.runtime.devices.bandwidth import bandwidth_for_gpu

        return bandwidth_for_gpu(gpu or DEFAULT_GPU)
    if isinstance(bandwidth, tuple):
        if len(bandwidth) != 2:
            raise ValueError(f"bandwidth must be a number or a (d2h, h2d) pair, got {bandwidth}")
        return float(bandwidth[0]), float(bandwidth[1])
    return float(bandwidth), float(bandwidth)
