"""Measure this machine as a HardwareProfile ("this-cpu"). Imports torch.

What is measured, each the best of a few short runs (about a second in all):

* peak FLOP/s per dtype: a square matmul (float32, float64, bfloat16);
* memory bandwidth: ``dst.copy_(src)`` of a 64 MiB buffer, counting read + write;
* host link, both directions: the same copy, counting the bytes moved once. On the emulated
  device, "device" and host memory are the same DRAM and a copy is a memcpy;
* launch overhead: the time of a tiny op (torch's dispatch cost per op);
* memory: the machine's physical RAM;
* the host side (``host_memory_bandwidth``, ``host_adam_rate``): the same DRAM bandwidth,
  and the parameters per second of torch's CPU AdamW step over 2^21 fp32 parameters, the
  faster of ``fused=True`` and ``foreach=True`` (on a 2-core machine fused was about 15x
  the foreach rate). This is what an optimizer step on the host costs when the device is a
  GPU in this machine (``outcore.weights.step_cost``).

``copy_engines`` is 2: the emulated device runs one copy-engine thread per direction
(``outcore.runtime.devices.emulated``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import cache

import torch

from outcore.cost.profiles import THIS_CPU, HardwareProfile


def _best(fn: Callable[[], object], repeats: int, budget_s: float = 0.25) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs (stops early past ``budget_s``)."""
    fn()  # warm up
    best = float("inf")
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return best


def _matmul_peak(dtype: torch.dtype, n: int) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    t = _best(lambda: torch.mm(a, b), repeats=8)
    return 2.0 * n**3 / t


def _copy_seconds(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    return _best(lambda: dst.copy_(src), repeats=6)


def _launch_overhead() -> float:
    x = torch.ones(1)
    y = torch.ones(1)
    loops = 200

    def run() -> None:
        for _ in range(loops):
            torch.add(x, y)

    return _best(run, repeats=5) / loops


def measure_adam_rate(numel: int = 1 << 21, repeats: int = 4) -> tuple[float, str]:
    """(parameters per second, implementation) of the faster of torch's CPU AdamW
    ``fused=True`` and ``foreach=True`` on one fp32 tensor of ``numel`` parameters."""
    rates: dict[str, float] = {}
    for impl in ("fused", "foreach"):
        p = torch.zeros(numel, requires_grad=True)
        p.grad = torch.full_like(p, 1e-3)
        try:
            opt = torch.optim.AdamW([p], lr=1e-3, fused=(impl == "fused") or None,
                                    foreach=(impl == "foreach") or None)
            rates[impl] = numel / _best(opt.step, repeats=repeats)
        except (RuntimeError, TypeError):  # an implementation this torch lacks on CPU
            continue
    best = max(rates, key=rates.__getitem__)
    return rates[best], best


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return 8 * 2**30


@cache
def measure_this_cpu() -> HardwareProfile:
    """Measure this machine once per process and return its profile."""
    nbytes = 64 * 2**20
    with torch.no_grad():
        peaks = {
            "float32": _matmul_peak(torch.float32, 512),
            "float64": _matmul_peak(torch.float64, 384),
            "bfloat16": _matmul_peak(torch.bfloat16, 384),
        }
        copy_s = _copy_seconds(nbytes)
        launch = _launch_overhead()
    adam, impl = measure_adam_rate()
    link = nbytes / copy_s
    return HardwareProfile(
        name=THIS_CPU,
        description=f"this machine: {os.cpu_count()} CPUs, torch {torch.__version__}, "
                    f"{torch.get_num_threads()} threads (measured)",
        memory=_physical_memory(),
        peak_flops=peaks,
        memory_bandwidth=2 * link,
        h2d_bandwidth=link,
        d2h_bandwidth=link,
        copy_engines=2,
        launch_overhead=launch,
        link="memcpy (emulated device)",
        shared_memory=True,
        sources=("measured by outcore.cost.measure_host at first use",
                 f"host AdamW: torch.optim.AdamW({impl}=True) on CPU, measured"),
        host_memory_bandwidth=2 * link,
        host_adam_rate=adam,
    )
