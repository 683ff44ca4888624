"""Offload/prefetch overlap on the CPU-emulated device (issue 3, benchmark).

For a VGG-style and a ResNet-style model on this CPU, run the offload-all schedule with the
copy engines at a bandwidth that hides the transfers behind compute, and at one that does
not, beside the no-offload (liveness) baseline measured in the same run. Prints step time,
the ratio to the baseline, and the overlapped and exposed transfer seconds the device
measured.

    .venv/bin/python benchmarks/device_overlap.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from outcore import zoo
from outcore.capture import capture
from outcore.plan.lower import lower
from outcore.policies import baseline
from outcore.runtime.devices import EmulatedDevice, SyncCPUDevice
from outcore.runtime.executor import Executor

WORKLOADS = [("vgg16", 8, True), ("resnet32-cifar", 64, False)]


def timed_runs(executor: Executor, batch, repeats: int) -> float:
    executor.run(batch, apply=False)  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        executor.run(batch, apply=False)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    table = Table(title="offload-all on the emulated device: hidden vs exposed transfers")
    for col in ("model", "setting", "link GB/s", "step s", "x baseline", "copied MB",
                "overlapped s", "exposed s"):
        table.add_column(col, justify="left" if col in ("model", "setting") else "right")
    for name, batch_size, small in WORKLOADS:
        w = zoo.get(name, batch_size, small=small)
        graph = capture(w.model, w.loss_fn, w.batch)
        base = timed_runs(Executor(graph, lower(graph, baseline.liveness(graph)), SyncCPUDevice()),
                          w.batch, args.repeats)
        table.add_row(name, "liveness (no copies)", "-", f"{base:.3f}", "1.00", "0", "-", "-")
        schedule = lower(graph, baseline.offload_all(graph))
        moved = sum(graph.tensors[i.tensor].nbytes for i in schedule.instructions
                    if type(i).__name__ == "Offload")
        # a link that moves everything in a tenth of the compute time, and one that needs 3x
        for label, seconds in (("hidden", base / 10), ("exposed", base * 3)):
            bandwidth = moved / seconds
            with EmulatedDevice(None, bandwidth, bandwidth) as device:
                executor = Executor(graph, schedule, device)
                executor.run(w.batch, apply=False)
                device.reset_stats()
                step = timed_runs(executor, w.batch, args.repeats)
                stats = device.stats()
            runs = args.repeats + 1
            table.add_row(name, f"offload-all, {label}", f"{bandwidth / 1e9:.3f}", f"{step:.3f}",
                          f"{step / base:.2f}", f"{2 * moved / 1e6:.1f}",
                          f"{stats.overlapped_s / runs:.3f}", f"{stats.exposed_s / runs:.3f}")
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
