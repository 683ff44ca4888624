"""Simulator fidelity on this CPU (issue 4, item 5).

For three models and three schedules (keep-all, offload-all, and a mixed plan that
recomputes the outputs of cheap ops and offloads every other remaining activation):

* run the schedule on the CPU-emulated device, its copy engines at a link bandwidth chosen
  so that the transfers take about 80% of the step's compute time (partly hidden), with
  timed steps (the profile) and untimed steps (the measurement) interleaved;
* profile from the timed steps (``outcore.cost.measure_step``): per-op seconds and the host
  costs of Frees and copy issues, Waits excluded; the Wait costs come from the device's
  calibration (``calibrate_waits``: wake-up after a blocking Wait, cost of a finished one);
* simulate the schedule with that profile and the same link;
* compare: the simulated peak must equal the measured peak to the byte, and the simulated
  step time should be within 10% of the measured median.

The last columns repeat the simulation with ops profiled on an instant link instead (no
copy thread busy beside the kernels). On this 2-core machine the copy threads slow the
kernels down; ``compute x`` is that slowdown (in-step op time / instant-link op time),
which the instant-link profile cannot know.

    .venv/bin/python benchmarks/sim_fidelity.py [--repeats 7]

Timings on a loaded machine are noisy: run it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics

import torch
from rich.console import Console
from rich.table import Table

import outcore
from outcore import zoo
from outcore.cost.measure_step import profile_from_steps, profile_step
from outcore.cost.measured import MeasuredProfile
from outcore.plan.lower import lower
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Offload
from outcore.policies import baseline
from outcore.runtime.devices import EmulatedDevice
from outcore.runtime.devices.calibrate import WaitCalibration, calibrate_waits
from outcore.runtime.executor import Executor
from outcore.sim import simulate

WORKLOADS = [("resnet20-cifar", 32, {}), ("vgg11", 16, {"small": True}),
             ("transformer", 8, {"small": True})]
LATENCY = 2e-4  # seconds per copy on the emulated engine (its measured fixed cost)


def mixed_plan(graph) -> Plan:
    """Recompute the outputs of cheap ops, offload every other remaining activation."""
    plan = baseline.recompute_cheap(graph)
    plan.policy = "mixed"
    rest = [t for t in baseline.movable_activations(graph) if t not in plan.decisions]
    for tid in rest[::2]:
        plan.decisions[tid] = Decision.OFFLOAD
    return plan


def instant_profile(graph, schedule, batch, repeats: int) -> MeasuredProfile:
    """Per-op seconds of ``schedule`` with an instant link (no copy thread busy for long)."""
    with EmulatedDevice(None, math.inf, math.inf) as device:
        return profile_step(Executor(graph, schedule, device), batch, repeats=repeats)


def measure(graph, schedule, batch, bandwidth: float, repeats: int, waits: WaitCalibration
            ) -> tuple[float, int, MeasuredProfile]:
    """Median untimed step seconds, measured peak, and the profile of the timed steps
    run between them, on the emulated device with this link."""
    with EmulatedDevice(None, bandwidth, bandwidth, latency_s=LATENCY) as device:
        executor = Executor(graph, schedule, device)
        executor.run(batch, apply=False)
        timed, untimed = [], []
        for _ in range(repeats):
            timed.append(executor.run(batch, apply=False, timed=True))
            untimed.append(executor.run(batch, apply=False))
    profile = profile_from_steps(graph, schedule, timed, device=device.name, waits=waits)
    return statistics.median(r.seconds for r in untimed), untimed[-1].peak_bytes, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    waits = calibrate_waits(LATENCY)
    table = Table(title="simulated vs measured on the CPU-emulated device (Wait wake-up "
                        f"{waits.wake * 1e3:.3f} ms, finished Wait {waits.wait * 1e6:.1f} us)")
    for col in ("model", "schedule", "link MB/s", "measured s", "simulated s", "error %",
                "measured peak", "simulated peak", "peaks equal", "compute x",
                "instant-link sim s", "its error %"):
        table.add_column(col, justify="left" if col in ("model", "schedule") else "right")
    for name, batch_size, options in WORKLOADS:
        torch.manual_seed(0)
        work = zoo.get(name, batch_size, **options)
        graph = outcore.capture(work.model, work.loss_fn, work.batch)
        schedules = [("keep-all", lower(graph, baseline.keep_all(graph))),
                     ("offload-all", lower(graph, baseline.offload_all(graph))),
                     ("mixed", lower(graph, mixed_plan(graph)))]
        compute = sum(instant_profile(graph, schedules[0][1], work.batch,
                                      args.repeats).op_seconds)
        for label, schedule in schedules:
            moved = sum(graph.tensors[i.tensor].nbytes for i in schedule.instructions
                        if isinstance(i, Offload))
            bandwidth = max(moved, 1) / (0.8 * compute)
            measured, peak, profile = measure(graph, schedule, work.batch, bandwidth,
                                              args.repeats, waits)
            sim = simulate(graph, schedule, profile.with_link(bandwidth, latency=LATENCY))
            instant = instant_profile(graph, schedule, work.batch, args.repeats)
            instant = instant.with_link(bandwidth, latency=LATENCY, host_costs=dataclasses.replace(
                instant.host_costs, wait=waits.wait, wake=waits.wake))
            other = simulate(graph, schedule, instant)
            slowdown = sum(profile.op_seconds) / sum(instant.op_seconds)
            table.add_row(name, label, f"{bandwidth / 1e6:.1f}" if moved else "-",
                          f"{measured:.4f}", f"{sim.step_time:.4f}", _error(sim, measured),
                          str(peak), str(sim.peak_bytes), "yes" if peak == sim.peak_bytes else "NO",
                          f"{slowdown:.2f}", f"{other.step_time:.4f}", _error(other, measured))
    Console(width=170).print(table)


def _error(sim, measured: float) -> str:
    return f"{100 * (sim.step_time - measured) / measured:+.1f}"


if __name__ == "__main__":
    main()
