"""Spine speed (issue 2 benchmark).

1. Capture plus analysis (liveness curve, reference peaks, liveness plan lowered and
   verified) of ResNet-152 at batch 256 with fake tensors; target under 30 s here.
2. The executor's keep-all step against eager PyTorch on a ResNet-18-sized model on this CPU
   (ResNet-18 topology and width, 112x112 images, batch 4): median of repeats, alternating
   the two so that machine noise hits both; target within 5%. The executor runs without
   its memory tracker (``measure=False``), as a Trainer's steps after the first of a batch
   shape do on the CPU and CUDA (``Executor.needs_measuring``); the tracked step is printed
   beside it. glibc's malloc is told to keep
   freed memory (``--keep-heap``, default on) for both: otherwise every step of keep-all,
   which frees nothing until the step ends, pays fresh page faults for its whole footprint,
   an artefact of emulating device memory with the host's allocator.

    .venv/bin/python benchmarks/spine_speed.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

from rich.console import Console
from rich.table import Table

from outcore import zoo
from outcore.capture import capture
from outcore.graph.bounds import reference_peaks
from outcore.graph.liveness import memory_per_step
from outcore.plan.lower import lower
from outcore.plan.verify import verify
from outcore.policies import baseline
from outcore.runtime.executor import Executor
from outcore.units import format_bytes


def capture_and_analyse() -> tuple[float, float, int, str]:
    start = time.perf_counter()
    work = zoo.get("resnet152", 256, fake=True)
    graph = capture(work.model, work.loss_fn, work.batch)
    captured = time.perf_counter() - start
    memory_per_step(graph)
    peaks = reference_peaks(graph)
    verify(graph, lower(graph, baseline.liveness(graph)))
    return captured, time.perf_counter() - start, len(graph.ops), format_bytes(peaks.liveness)


def step_times(repeats: int) -> tuple[float, float, float]:
    work = zoo.get("resnet18", 4, image_size=112)
    graph = capture(work.model, work.loss_fn, work.batch)
    executor = Executor(graph, lower(graph, baseline.keep_all(graph)))
    x, y = work.batch

    def eager() -> None:
        work.model.zero_grad(set_to_none=True)
        work.loss_fn(work.model(x), y).backward()

    def planned() -> None:
        work.model.zero_grad(set_to_none=True)
        executor.run((x, y), measure=False)

    def measured() -> None:
        work.model.zero_grad(set_to_none=True)
        executor.run((x, y))

    runs = {"eager": eager, "planned": planned, "measured": measured}
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return tuple(statistics.median(samples[k]) for k in runs)  # type: ignore[return-value]


def keep_heap() -> bool:
    """Ask glibc to keep freed blocks in the heap (no mmap/trim per large block)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 2**30 - 1) and
                libc.mallopt(m_trim_threshold, 2**31 - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-keep-heap", action="store_true",
                        help="leave glibc's malloc thresholds alone")
    args = parser.parse_args()
    if not args.no_keep_heap:
        keep_heap()
    captured, total, ops, liveness = capture_and_analyse()
    eager_s, planned_s, measured_s = step_times(args.repeats)
    table = Table(title="spine speed")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row(f"ResNet-152 b256 fake: capture ({ops} ops)", f"{captured:.1f} s", "")
    table.add_row(f"  + analysis (in-core peak {liveness})", f"{total:.1f} s", "< 30 s")
    table.add_row("ResNet-18 (112px, b4) eager step", f"{eager_s * 1e3:.1f} ms", "")
    table.add_row("  executor keep-all step", f"{planned_s * 1e3:.1f} ms", "")
    table.add_row("  ratio executor / eager", f"{planned_s / eager_s:.3f}", "<= 1.05")
    table.add_row("  executor keep-all step, peak measured", f"{measured_s * 1e3:.1f} ms", "")
    table.add_row("  ratio measured executor / eager", f"{measured_s / eager_s:.3f}", "")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
