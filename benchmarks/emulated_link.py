"""The cpu-emulated link: scaled by peak FLOP/s, or by this model's measured compute.

The emulated device stands for a GPU (here v100-pcie): plans are made with that GPU's cost
model and run on the CPU, with copy engines standing for its host link. Two ways to set the
link's speed:

* ``flop``: ``bandwidth.bandwidth_for_gpu``, the GPU's link times (this CPU's matmul FLOP/s
  / the GPU's peak FLOP/s): what the device starts with;
* ``model``: ``link_calibration.graph_link``, the GPU's link times (the compute the cost
  model prices for this step / the compute measured here, ``outcore.demo.compute_seconds``):
  what a Trainer sets after its first steps, and what ``make demo`` uses.

For each model, every policy's plan (framework kernels, one sub-batch) runs on an emulated
device whose capacity is the budget, under each link, in interleaved rounds (one warm-up
and one timed step per plan and round, ``--rounds`` rounds); per plan the median measured
step against outcore-auto's, beside the simulated step against outcore-auto's, and the
eager step (``loss.backward()``, no budget) for scale. Ratios within one run only.

    python benchmarks/emulated_link.py [--rounds 3] [--models resnet32,lm]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from dynamic_shapes import LM, batch, lm_loss

from outcore import zoo
from outcore.api import cost_model_for, plan
from outcore.capture import capture
from outcore.demo import compute_seconds, framework_kernels
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.policies.auto import compute_floor
from outcore.runtime.devices import make_device
from outcore.runtime.devices.bandwidth import bandwidth_for_gpu
from outcore.runtime.executor import Executor
from outcore.runtime.link_calibration import graph_link

GPU = "v100-pcie"
POLICIES = ("outcore-auto", "pooch", "dymem", "modnn", "superneurons", "vdnn-all",
            "offload-all", "outcore-checkpoint")


def workloads(names: list[str]):  # type: ignore[no-untyped-def]
    """(label, model, loss_fn, batch, budget fraction of the in-core peak)."""
    for name in names:
        if name == "resnet32":
            torch.manual_seed(0)
            w = zoo.get("resnet32-cifar", 32)
            yield "resnet32-cifar b32, 1/3 of in-core", w.model, w.loss_fn, w.batch, 1 / 3
        elif name == "lm":
            torch.manual_seed(0)
            yield "4-layer LM d128 b8 L128, 60%", LM(128, 4), lm_loss, batch(128, 8), 0.6
        else:
            raise SystemExit(f"unknown model {name!r}: resnet32, lm")


def eager_seconds(model, loss_fn, data, repeats: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad()
        start = time.perf_counter()
        loss_fn(model(data[0]), data[1]).backward()
        best = min(best, time.perf_counter() - start)
    model.zero_grad()
    return best


def measure(graph, plans, data, budget: int, link: tuple[float, float],  # type: ignore[no-untyped-def]
            rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(rounds):
        for name, planned in plans.items():
            device = make_device("cpu-emulated", capacity=budget, bandwidth=link)
            try:
                executor = Executor(graph, planned.schedule, device)
                executor.run(data, apply=False)
                start = time.perf_counter()
                executor.run(data, apply=False)
                times[name].append(time.perf_counter() - start)
            finally:
                device.close()
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="resnet32,lm")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    cost = cost_model_for(GPU)
    print("| model | link | MB/s | policy | simulated / auto | measured / auto | measured ms |")
    print("|---|---|---|---|---|---|---|")
    for label, model, loss_fn, data, fraction in workloads(args.models.split(",")):
        graph = capture(model, loss_fn, data)
        budget = int(reference_peaks(graph).liveness * fraction)
        plans = {}
        for name in POLICIES:
            try:
                planned = framework_kernels(plan(graph, budget, policy=name, cost=cost,
                                                 cache=False), budget, cost)
            except InfeasibleBudgetError:  # a policy that cannot fit: not in the table
                continue
            if planned is not None and planned.plan.sub_batches == 1:
                plans[name] = planned
        modelled, here = compute_floor(graph, cost), compute_seconds(graph, data)
        links = {"flop": bandwidth_for_gpu(GPU), "model": graph_link(GPU, modelled, here)}
        sim = plans["outcore-auto"].simulation.step_time
        for kind, link in links.items():
            medians = measure(graph, plans, data, budget, link, args.rounds)
            for name in sorted(plans, key=lambda n: plans[n].simulation.step_time):
                print(f"| {label} | {kind} | {link[0] / 1e6:.0f} | {name} | "
                      f"{plans[name].simulation.step_time / sim:.3f} | "
                      f"{medians[name] / medians['outcore-auto']:.3f} | "
                      f"{medians[name] * 1e3:.0f} |", flush=True)
        print(f"| {label} | eager (no budget) | - | - | - | - | "
              f"{eager_seconds(model, loss_fn, data) * 1e3:.0f} |")
        print(f"| {label} | modelled compute {modelled * 1e3:.1f} ms on {GPU}, measured "
              f"{here * 1e3:.1f} ms here | | | | | |", flush=True)


if __name__ == "__main__":
    main()
