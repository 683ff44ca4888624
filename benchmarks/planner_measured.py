"""The planners measured on the CPU-emulated device (issue 15, point 5).

For three small models at two budgets each (70% and 50% of the in-core peak, raised to a
tenth of the way from the lowest feasible peak to it where that is higher), every seed policy
and outcore-auto plan the step on one cost model of *this* machine: op seconds profiled on
the emulated device (instant link, ``profile_step``) and its link (``with_link``; bandwidth
chosen so that offloading every activation takes about 80% of the step's compute, so copies
matter but can hide). Then every plan runs on an emulated device whose capacity is the
budget, in interleaved rounds (one step of each plan per round, ``--repeats`` rounds, after
one warm-up each); per plan:

* ``measured``: the median step (wall clock), shown as a ratio to outcore-auto's median;
* ``simulated``: the simulator's step on the same cost model, as a ratio to outcore-auto's;
* ``peak``: the tracker's measured peak, which must equal the planned (predicted) peak;
* ``paired``: outcore-auto against this plan round by round (``paired.paired_ratio``: the
  median of the per-round ratios auto/plan and its order-statistic interval; resolved when
  the interval excludes 1). Each round runs the plans in a fresh random order, so no plan
  always follows another. A seed whose schedule is outcore-auto's own, instruction for
  instruction, is marked ``same plan``: it is the same program, so it is neither faster nor
  slower, and it is left out of both verdicts below;
* per case: whether outcore-auto is **no slower than every seed** (no paired interval lies
  wholly above 1) and how many seeds it is resolved faster than; whether the simulated
  ranking **matches the measured one**: among the pairs of distinct plans whose measured
  order is resolved (their own paired interval excludes 1), how many the simulator orders
  alike (pairs within the noise are ties and agree with any order); and, as before,
  Spearman's rank correlation of the medians and the share of pairs ordered alike with
  medians within ``TIE`` counted as ties.

Seed policies run with their operator variants dropped (framework kernels, as outcore-auto's
portfolio runs them); moDNN without sub-batches (no recapture). Speed is only reported as
ratios within one run; timings on a loaded machine are noisy.

    python benchmarks/planner_measured.py [--repeats 15] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from paired import Paired, paired_ratio

import outcore
from outcore import zoo
from outcore.cost.measure_step import profile_step
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.schedule import Schedule
from outcore.policies import baseline
from outcore.policies.registry import PolicyContext, get
from outcore.refusal import lowest_peak
from outcore.runtime.devices import EmulatedDevice
from outcore.runtime.devices.calibrate import calibrate_waits
from outcore.runtime.executor import Executor
from outcore.sim import simulate

SEEDS = ("vdnn-all", "vdnn-conv", "vdnn-dyn", "superneurons", "modnn", "pooch", "dymem")
MODELS = (("resnet20-cifar", 32, {}), ("vgg11", 16, {"small": True}),
          ("transformer", 8, {"small": True}))
BUDGETS = (0.7, 0.5)
QUICK_MODELS = (("resnet20-cifar", 4, {"small": True}),)
QUICK_BUDGETS = (0.6,)
LATENCY = 2e-4  # seconds per copy on the emulated engine
TIE = 0.03  # measured medians closer than this (relative) are a tie


@dataclass
class Entry:
    """One plan of one case: its schedule, predicted peak and simulated step; after
    ``measure``: the measured steps and peak."""

    policy: str
    graph: Graph
    schedule: Schedule
    predicted: int
    simulated: float
    seconds: list[float] = field(default_factory=list)
    measured_peak: int | None = None
    same_as_auto: bool = False

    @property
    def measured(self) -> float:
        return statistics.median(self.seconds)


@dataclass
class Case:
    model: str
    fraction: float
    budget: int
    entries: list[Entry]
    refused: list[str]

    def auto(self) -> Entry:
        return next(e for e in self.entries if e.policy == "outcore-auto")

    def versus_auto(self, entry: Entry) -> Paired:
        """outcore-auto's per-round steps over ``entry``'s (below 1: auto faster)."""
        return paired_ratio(self.auto().seconds, entry.seconds)

    def auto_not_slower(self) -> bool:
        """No distinct seed plan is resolved faster than outcore-auto."""
        return all(self.versus_auto(e).verdict != "slower" for e in self.seeds())

    def seeds(self) -> list[Entry]:
        """The seed plans that are not outcore-auto's own schedule."""
        return [e for e in self.entries if e.policy != "outcore-auto" and not e.same_as_auto]

    def resolved_pairs(self) -> tuple[int, int, list[str]]:
        """(pairs of distinct plans whose measured order is resolved, of them ordered alike
        by the simulator, the others as "measured faster < measured slower")."""
        distinct = [e for e in self.entries if not e.same_as_auto]
        resolved = agree = 0
        wrong: list[str] = []
        for i, a in enumerate(distinct):
            for b in distinct[i + 1:]:
                verdict = paired_ratio(a.seconds, b.seconds).verdict
                if verdict == "unresolved":
                    continue
                resolved += 1
                faster, slower = (a, b) if verdict == "faster" else (b, a)
                if faster.simulated < slower.simulated:
                    agree += 1
                else:
                    wrong.append(f"{faster.policy} < {slower.policy}")
        return resolved, agree, wrong


def cost_of(graph: Graph, batch: Any, repeats: int) -> Any:
    """This machine's profile of ``graph`` (instant link) with a link that makes offloading
    every activation take about 80% of the compute time."""
    waits = calibrate_waits(LATENCY)
    liveness = lower(graph, baseline.liveness(graph))
    with EmulatedDevice(None, math.inf, math.inf) as device:
        profile = profile_step(Executor(graph, liveness, device), batch, repeats=repeats,
                               waits=waits)
    moved = sum(graph.tensors[t].nbytes for t in baseline.movable_activations(graph))
    bandwidth = max(moved, 1) / (0.8 * sum(profile.op_seconds))
    return profile.with_link(bandwidth, latency=LATENCY,
                             host_costs=dataclasses.replace(profile.host_costs,
                                                            wait=waits.wait, wake=waits.wake))


def plans(graph: Graph, budget: int, cost: Any) -> tuple[list[Entry], list[str]]:
    """Every seed policy's plan (framework kernels) and outcore-auto's that fit ``budget``;
    the names of those that do not."""
    entries, refused = [], []
    for name in SEEDS:
        try:
            out = get(name).fn(graph, PolicyContext(budget=budget, cost=cost))
        except InfeasibleBudgetError:
            refused.append(name)
            continue
        schedule = dataclasses.replace(out.schedule, variants={})
        peak = memory_curve(out.graph, schedule).peak
        if peak > budget or out.graph is not graph:
            refused.append(name)
            continue
        entries.append(Entry(name, graph, schedule, peak,
                             simulate(graph, schedule, cost).step_time))
    planned = outcore.plan(graph, budget, policy="outcore-auto", cost=cost, cache=False,
                           host_budget=None)
    entries.append(Entry("outcore-auto", planned.graph, planned.schedule,
                         planned.predicted_peak, planned.simulation.step_time))
    for e in entries[:-1]:
        e.same_as_auto = same_program(e.schedule, planned.schedule)
    return entries, refused


def same_program(a: Schedule, b: Schedule) -> bool:
    """Whether two schedules run the same instructions with the same kernels."""
    return (a.instructions == b.instructions and a.variants == b.variants
            and a.sub_batches == b.sub_batches)


def measure(entries: list[Entry], batch: Any, budget: int, bandwidth: float,
            repeats: int) -> None:
    """Run every entry on an emulated device of capacity ``budget``: one step of each per
    round, in a fresh random order each round (seeded, so a run is repeatable)."""
    order = random.Random(0)
    with EmulatedDevice(budget, bandwidth, bandwidth, latency_s=LATENCY) as device:
        executors = [Executor(e.graph, e.schedule, device) for e in entries]
        for ex in executors:
            ex.run(batch, apply=False)  # warm-up
        pairs = list(zip(entries, executors, strict=True))
        for _ in range(repeats):
            order.shuffle(pairs)
            for entry, ex in pairs:
                result = ex.run(batch, apply=False)
                entry.seconds.append(result.seconds)
                entry.measured_peak = result.peak_bytes


def run_case(name: str, batch_size: int, options: dict[str, Any], fractions: tuple[float, ...],
             repeats: int) -> list[Case]:
    torch.manual_seed(0)
    work = zoo.get(name, batch_size, **options)
    graph = outcore.capture(work.model, work.loss_fn, work.batch)
    cost = cost_of(graph, work.batch, repeats)
    peak = reference_peaks(graph).liveness
    lowest = lowest_peak(graph, cost)
    cases: list[Case] = []
    for wanted in fractions:  # at least a tenth of the way from the floor to the peak
        budget = max(int(wanted * peak), lowest + (peak - lowest) // 10)
        if any(c.budget == budget for c in cases):  # both raised to the same: half way
            budget = lowest + (peak - lowest) // 2
        fraction = budget / peak
        entries, refused = plans(graph, budget, cost)
        measure(entries, work.batch, budget, cost.h2d_bandwidth, repeats)
        cases.append(Case(name, fraction, budget, entries, refused))
    return cases


def ranks(values: list[float]) -> list[float]:
    """Average ranks (ties share the mean rank)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (nan with fewer than two values or a
    constant side)."""
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    if n < 2:
        return math.nan
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else math.nan


def pairwise(sim: list[float], measured: list[float], tie: float = TIE) -> float:
    """Share of pairs the simulation orders as measured (measured ties agree either way)."""
    agree = total = 0
    for i in range(len(sim)):
        for j in range(i + 1, len(sim)):
            total += 1
            close = abs(measured[i] - measured[j]) <= tie * max(measured[i], measured[j])
            if close or (sim[i] - sim[j]) * (measured[i] - measured[j]) > 0:
                agree += 1
    return agree / total if total else math.nan


def report(cases: list[Case]) -> None:
    print("| model | budget | policy | simulated / auto | measured / auto | auto / plan, paired "
          "| predicted peak | measured peak | equal |\n|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        auto = case.auto()
        for e in sorted(case.entries, key=lambda e: e.measured):
            if e is auto:
                versus = "-"
            elif e.same_as_auto:
                versus = "same plan"
            else:
                p = case.versus_auto(e)
                versus = f"{p.text()} {p.verdict}"
            print(f"| {case.model} | {case.fraction:.0%} ({case.budget} B) | {e.policy} | "
                  f"{e.simulated / auto.simulated:.3f} | {e.measured / auto.measured:.3f} | "
                  f"{versus} | {e.predicted} | {e.measured_peak} | "
                  f"{'yes' if e.predicted == e.measured_peak else 'NO'} |")
    print("\n| model | budget | plans | same as auto | refused | auto no slower than every seed "
          "(paired) | auto resolved faster than | resolved pairs ordered alike | Spearman "
          "| pairs agreeing (medians, tie 3%) |\n|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        sim = [e.simulated for e in case.entries]
        meas = [e.measured for e in case.entries]
        same = [e.policy for e in case.entries if e.same_as_auto]
        faster = sum(case.versus_auto(e).verdict == "faster" for e in case.seeds())
        resolved, agree, wrong = case.resolved_pairs()
        unlike = f" (measured, not simulated: {'; '.join(wrong)})" if wrong else ""
        print(f"| {case.model} | {case.fraction:.0%} | {len(case.entries)} | "
              f"{', '.join(same) or '-'} | {', '.join(case.refused) or '-'} | "
              f"{'yes' if case.auto_not_slower() else 'NO'} | {faster} of "
              f"{len(case.seeds())} | {agree} of {resolved}{unlike} | {spearman(sim, meas):.2f} | "
              f"{pairwise(sim, meas):.0%} |", flush=True)


def main(argv: list[str] | None = None) -> list[Case]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15,
                        help="rounds (15 gives the paired interval 96.5% coverage)")
    parser.add_argument("--quick", action="store_true", help="one tiny case (for tests)")
    parser.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    args = parser.parse_args(argv)
    models = QUICK_MODELS if args.quick else MODELS
    if args.models:
        models = tuple(m for m in MODELS if m[0] in args.models.split(","))
    fractions = QUICK_BUDGETS if args.quick else BUDGETS
    cases: list[Case] = []
    for name, batch, opts in models:
        found = run_case(name, batch, dict(opts), fractions, args.repeats)
        report(found)  # each model as soon as it is measured
        cases += found
    if len(models) > 1:
        print("\nAll cases:")
        report(cases)
    return cases


if __name__ == "__main__":
    main()
