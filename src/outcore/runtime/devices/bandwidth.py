"""Link bandwidth for the emulated device, scaled so a CPU run keeps a GPU's ratio.

On the target GPU, moving ``B`` bytes takes ``B / link_bw`` while an op of ``F`` FLOPs takes
``F / gpu_flops``. Here the same op takes ``F / cpu_flops``; for the copy to keep the same
share of the step, the emulated link must run at

    emulated_bw = link_bw * cpu_flops / gpu_flops.

``cpu_flops`` is measured once per process (and per dtype and size) by timing a square
matmul on this CPU, outside any dispatch mode. Peak GPU FLOP/s against achieved CPU FLOP/s
makes the emulated link conservative (slower) by the GPU's matmul efficiency, which the cost
model puts at a few per cent for small kernels: on ResNet-32 at batch 32 this link is ~16x
slower than one that keeps the model's own ratio. It is the link ``make_device`` gives; a
Trainer then rescales it to its model (``outcore.runtime.link_calibration``).
"""

from __future__ import annotations

import functools
import math
import time

import torch
from torch.utils._python_dispatch import _disable_current_modes

from outcore.errors import ProfileError


def emulated_bandwidth(link_bw: float, gpu_flops: float, cpu_flops: float) -> float:
    """Bytes/s the emulated link needs so that transfer/compute time matches the GPU's."""
    for label, value in (("link bandwidth", link_bw), ("GPU FLOP/s", gpu_flops),
                         ("CPU FLOP/s", cpu_flops)):
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{label} must be a finite number > 0, got {value}")
    return link_bw * cpu_flops / gpu_flops


@functools.cache
def cpu_flops(dtype: torch.dtype = torch.float32, n: int = 512, repeats: int = 5) -> float:
    """This CPU's matmul FLOP/s for ``dtype``: the best of ``repeats`` timed ``n x n``
    products after one warm-up (``2 n^3`` FLOPs each). Cached per process and arguments."""
    if n <= 0 or repeats <= 0:
        raise ValueError(f"n and repeats must be > 0, got n={n}, repeats={repeats}")
    with _disable_current_modes(), torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        a = torch.rand(n, n, generator=gen).to(dtype)
        b = torch.rand(n, n, generator=gen).to(dtype)
        out = torch.empty(n, n, dtype=dtype)
        torch.mm(a, b, out=out)
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / max(best, 1e-9)


def bandwidth_for_gpu(name: str, dtype: str = "float32",
                      cpu: float | None = None) -> tuple[float, float]:
    """(d2h, h2d) bytes/s for the emulated device standing in for GPU profile ``name``.

    Uses the profile's host-link bandwidth per direction and its peak FLOP/s for ``dtype``
    (``outcore.cost.profiles.get_profile``, imported lazily). ``cpu`` overrides this CPU's
    FLOP/s, e.g. with ``get_profile("this-cpu").peak(dtype)`` or a fixed number for
    reproducible runs; by default ``cpu_flops`` measures it.
    """
    from outcore.cost.profiles import get_profile

    profile = get_profile(name)
    gpu = profile.peak(dtype)  # a dtype it lacks: its nearest, with a ProfileDtypeWarning
    if cpu is None:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ProfileError(f"cannot time a {dtype!r} matmul on this CPU; pass cpu= FLOP/s")
        cpu = cpu_flops(torch_dtype)
    return (emulated_bandwidth(profile.bandwidth("d2h"), gpu, cpu),
            emulated_bandwidth(profile.bandwidth("h2d"), gpu, cpu))
