"""Planner table: in-core step, every seed policy, the previous greedy and outcore-optimal
(with its proven lower bound and gap) side by side, one cost model per row.

Run: ``python benchmarks/planner_table.py [--rows r50-pcie,r50-nvlink]``. Each row captures
its model with fake tensors and simulates every plan on the analytic cost model; a plan
that does not fit is shown as "-". ``bound`` is outcore-optimal's lower bound on the step of
any keep/offload/recompute plan (framework kernels, one sub-batch); ``gap`` is each policy's
distance to it. Planning seconds are wall-clock on this machine.
"""

from __future__ import annotations

import argparse
import time

from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.plan.memory import memory_curve
from outcore.policies.auto import plan_auto
from outcore.policies.optimal import plan_optimal
from outcore.policies.registry import PolicyContext, get
from outcore.sim import simulate

GiB = 2**30
#: name -> (zoo model, batch, gpu, budget in GiB or a fraction of the in-core peak)
ROWS = {
    "r50-pcie": ("resnet50", 640, "v100-pcie", 16.0),
    "r50-nvlink": ("resnet50", 640, "v100-nvlink", 16.0),
    "vgg16-maxwell": ("vgg16", 256, "titan-x-maxwell", 12.0),
    "r152-pcie": ("resnet152", 256, "v100-pcie", 16.0),
}
SEEDS = ("vdnn-dyn", "superneurons", "modnn", "pooch", "dymem")


def row(name: str) -> None:
    model, batch, gpu, budget_spec = ROWS[name]
    w = zoo.get(model, batch, fake=True)
    graph = capture(w.model, w.loss_fn, w.batch, fake=True, name=f"{model}-b{batch}")
    cost = cost_model_for(gpu)
    peak = reference_peaks(graph).liveness
    budget = int(budget_spec * GiB) if budget_spec > 1 else int(budget_spec * peak)
    times: dict[str, tuple[float | None, float]] = {}
    for seed in SEEDS:
        t0 = time.perf_counter()
        try:
            out = get(seed).fn(graph, PolicyContext(budget=budget, cost=cost))
            fits = memory_curve(out.graph, out.schedule).peak <= budget
            step = simulate(out.graph, out.schedule, cost).step_time if fits else None
        except InfeasibleBudgetError:  # infeasibility only; any other error is a bug
            step = None
        times[seed] = (step, time.perf_counter() - t0)
    t0 = time.perf_counter()
    try:
        _, schedule = plan_auto(graph, budget, cost)
        times["greedy"] = (simulate(graph, schedule, cost).step_time, time.perf_counter() - t0)
    except InfeasibleBudgetError:
        times["greedy"] = (None, time.perf_counter() - t0)
    result = plan_optimal(graph, budget, cost)
    times["optimal"] = (result.step_time, result.seconds)
    in_core = sum(cost.bind(graph).op_time(op) for op in graph.ops)
    feasible = [s for s, _ in times.values() if s is not None]
    times["outcore-auto"] = (min(feasible), sum(t for _, t in times.values()))
    bound = result.lower_bound
    print(f"\n{name}: {model} b{batch} on {gpu}, budget {budget / GiB:.1f} GiB "
          f"(in-core peak {peak / GiB:.1f} GiB), in-core step {in_core:.3f} s, "
          f"bound {bound:.3f} s")
    print("| policy | step (s) | gap to bound | planning (s) |\n|---|---|---|---|")
    for policy, (step, secs) in times.items():
        shown = "-" if step is None else f"{step:.3f}"
        gap = "-" if step is None else f"{(step / bound - 1) * 100:.1f}%"
        print(f"| {policy} | {shown} | {gap} | {secs:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default=",".join(ROWS))
    for name in parser.parse_args().rows.split(","):
        row(name)


if __name__ == "__main__":
    main()
