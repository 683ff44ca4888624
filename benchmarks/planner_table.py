"""Planner table (issue 15, point 3): per case, side by side in one run and on one analytic
cost model, the in-core step, every seed policy, outcore-auto's greedy candidate (the
"previous greedy"), PyTorch's own activation-memory-budget knapsack (recompute only;
``torch_knapsack.py`` says how it is mapped), outcore-auto and outcore-optimal, with
outcore-optimal's proven lower bound on the step and each planner's gap to it.

Run: ``python benchmarks/planner_table.py [--rows r50-pcie,r50-nvlink] [--quick]``.
Every model is captured with fake tensors (no memory is allocated). outcore-auto and
outcore-optimal run through ``outcore.plan`` (the public API, no plan cache), so a better
solver shows up here by re-running; the seed policies run through the policy registry with
their operator variants dropped, as outcore-auto's portfolio drops them: every column runs
the framework's kernels (vDNN's performance-optimal convolutions would otherwise beat the
in-core step). Step times are simulated seconds; "-" is a budget the policy cannot meet (or, for
torch's knapsack, one that recomputing alone cannot meet). ``bound``: no plan of keep /
offload / recompute decisions lowered by ``outcore.plan.lower`` (framework kernels, one
sub-batch) simulates faster; a policy that builds its own schedule (PoocH's early swap-in,
vDNN's) may beat it, which shows as a negative gap. Planning seconds are wall-clock on this
machine and include each policy's own simulation.

``r50b256-*`` is the budget sweep of ResNet-50 at batch 256 (v100-pcie) from 100% of its
in-core peak down to the lowest budget any plan reaches (``floor``: outcore-optimal's
refusal names it).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import outcore
from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.plan.memory import memory_curve
from outcore.policies.auto import greedy_policy
from outcore.policies.optimal import floor
from outcore.policies.registry import PolicyContext, get
from outcore.sim import simulate
from outcore.units import format_bytes

GiB = 2**30
SEEDS = ("vdnn-all", "vdnn-conv", "vdnn-dyn", "superneurons", "modnn", "pooch", "dymem")
GPT2_MEDIUM = (("n_layer", 24), ("n_head", 16), ("d_model", 1024))


@dataclass(frozen=True)
class Row:
    """A case: zoo model at ``batch`` on ``gpu``; ``budget`` is GiB when above 1, else a
    fraction of the in-core (free-at-last-use) peak; ``floor``: the lowest budget any plan
    reaches, ``outcore.policies.optimal.floor`` (``budget`` is then ignored)."""

    name: str
    model: str
    batch: int
    gpu: str
    budget: float
    opts: tuple[tuple[str, Any], ...] = ()
    small: bool = False
    floor: bool = False


SWEEP = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3)
ROWS: tuple[Row, ...] = (
    Row("r50-pcie", "resnet50", 640, "v100-pcie", 16.0),
    Row("r50-nvlink", "resnet50", 640, "v100-nvlink", 16.0),
    Row("vgg16-maxwell", "vgg16", 256, "titan-x-maxwell", 12.0),
    Row("r152-pcie", "resnet152", 256, "v100-pcie", 16.0),
    Row("inception-v4-35%", "inception-v4", 128, "v100-pcie", 0.35),
    Row("densenet121-35%", "densenet121", 64, "v100-pcie", 0.35),
    Row("transformer-a100-40%", "transformer", 8, "a100-40gb", 0.40),
    Row("transformer-h100-40%", "transformer", 8, "h100", 0.40),
    Row("gpt2-medium-a100-40%", "transformer", 8, "a100-40gb", 0.40, GPT2_MEDIUM),
    Row("gpt2-medium-h100-40%", "transformer", 8, "h100", 0.40, GPT2_MEDIUM),
    *(Row(f"r50b256-{round(f * 100)}%", "resnet50", 256, "v100-pcie", f) for f in SWEEP),
    Row("r50b256-floor", "resnet50", 256, "v100-pcie", 0.0, floor=True),
)
#: ``--quick``: one tiny row (a test runs it)
QUICK: tuple[Row, ...] = (Row("quick", "resnet20-cifar", 8, "v100-pcie", 0.5, small=True),)
COLUMNS = ("in-core", *SEEDS, "greedy", "torch-knapsack", "outcore-auto", "outcore-optimal")


@dataclass
class Result:
    """One row's figures: simulated step (None: does not fit) and planning seconds per
    column, the bound, and what outcore-auto chose."""

    row: Row
    budget: int
    in_core_peak: int
    steps: dict[str, float | None] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    bound: float | None = None
    optimal_exact: bool = False
    auto_choice: str = ""
    knapsack_fraction: float | None = None


_GRAPHS: dict[tuple[Any, ...], Graph] = {}


def graph_of(row: Row) -> Graph:
    """The fake-captured graph of ``row``'s model (captured once per model, batch, options)."""
    key = (row.model, row.batch, row.opts, row.small)
    if key not in _GRAPHS:
        w = zoo.get(row.model, row.batch, fake=True, small=row.small, **dict(row.opts))
        _GRAPHS[key] = capture(w.model, w.loss_fn, w.batch, fake=True,
                               name=f"{row.model}-b{row.batch}")
    return _GRAPHS[key]


def framework_kernels_step(graph: Graph, policy: str, budget: int, cost: Any) -> float | None:
    """``policy``'s simulated step on framework kernels (its operator variants dropped, as
    outcore-auto's portfolio drops them, so every column runs the same kernels), or None
    when its schedule does not fit ``budget``."""
    out = get(policy).fn(graph, PolicyContext(budget=budget, cost=cost))
    schedule = dataclasses.replace(out.schedule, variants={})
    if memory_curve(out.graph, schedule).peak > budget:
        return None
    return simulate(out.graph, schedule, cost).step_time


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    try:
        out = fn()
    except InfeasibleBudgetError:
        out = None
    return out, time.perf_counter() - t0


def run_row(row: Row) -> Result:
    graph = graph_of(row)
    cost = cost_model_for(row.gpu)
    peak = reference_peaks(graph).liveness
    if row.floor:
        budget = floor(graph, cost)
    else:
        budget = int(row.budget * GiB) if row.budget > 1 else int(row.budget * peak)
    res = Result(row, budget, peak)

    def planned(policy: str, **kw: Any) -> Callable[[], Any]:
        return lambda: outcore.plan(graph, budget, policy=policy, cost=cost, cache=False,
                                    host_budget=None, **kw)

    in_core, secs = timed(lambda: outcore.plan(graph, None, policy="liveness", cost=cost,
                                               cache=False, host_budget=None))
    res.steps["in-core"], res.seconds["in-core"] = in_core.simulation.step_time, secs
    for seed in SEEDS:
        step, secs = timed(lambda name=seed: framework_kernels_step(graph, name, budget, cost))
        res.steps[seed], res.seconds[seed] = step, secs
    out, secs = timed(lambda: greedy_policy(graph, PolicyContext(budget=budget, cost=cost)))
    res.steps["greedy"] = None if out is None else simulate(graph, out.schedule, cost).step_time
    res.seconds["greedy"] = secs
    from torch_knapsack import torch_knapsack_plan

    found, secs = timed(lambda: torch_knapsack_plan(graph, budget, cost))
    res.steps["torch-knapsack"] = (None if found is None
                                   else simulate(graph, found.schedule, cost).step_time)
    res.knapsack_fraction = None if found is None else found.fraction
    res.seconds["torch-knapsack"] = secs
    out, secs = timed(planned("outcore-auto"))
    res.steps["outcore-auto"] = None if out is None else out.simulation.step_time
    res.auto_choice = "" if out is None else out.plan.policy
    res.seconds["outcore-auto"] = secs
    out, secs = timed(planned("outcore-optimal", bound=True))
    res.steps["outcore-optimal"] = None if out is None else out.simulation.step_time
    res.seconds["outcore-optimal"] = secs
    if out is not None:
        res.bound = out.lower_bound
        res.optimal_exact = any("MILP optimum" in why for why in out.plan.reasons.values())
    return res


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _gap(step: float | None, bound: float | None) -> str:
    if step is None or bound is None or bound <= 0:
        return "-"
    return f"{(step / bound - 1) * 100:+.1f}%"


def header() -> list[str]:
    cols = ["row", "budget", "in-core peak", *COLUMNS, "bound", "auto gap",
            "optimal gap", "auto chose"]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def line(res: Result) -> str:
    seeds = [s for s in SEEDS if res.steps.get(s) is not None]
    best_seed = min((res.steps[s] for s in seeds), default=None)  # type: ignore[type-var]
    cells = [res.row.name, format_bytes(res.budget), format_bytes(res.in_core_peak)]
    for c in COLUMNS:
        text = _cell(res.steps.get(c))
        if c in SEEDS and best_seed is not None and res.steps.get(c) == best_seed:
            text = f"**{text}**"
        cells.append(text)
    cells += [_cell(res.bound), _gap(res.steps.get("outcore-auto"), res.bound),
              _gap(res.steps.get("outcore-optimal"), res.bound),
              res.auto_choice.replace("outcore-auto", "").strip(" ()") or "greedy"]
    return "| " + " | ".join(cells) + " |"


def seconds_line(res: Result) -> str:
    return "| " + " | ".join([res.row.name] + [f"{res.seconds.get(c, math.nan):.1f}"
                                              for c in COLUMNS]) + " |"


def run(rows: tuple[Row, ...]) -> Iterator[Result]:
    """Each row's Result, in order, printing its table line as soon as it is known."""
    print("Simulated step (s); bold: the best seed policy.", flush=True)
    print("\n".join(header()), flush=True)
    for row in rows:
        try:
            res = run_row(row)
        except Exception as exc:  # noqa: BLE001 (a bug in one planner: shown in its row)
            print(f"| {row.name} | failed: {type(exc).__name__}: {exc} |", flush=True)
            continue
        print(line(res), flush=True)
        yield res


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    parser.add_argument("--quick", action="store_true", help="one tiny row (for tests)")
    args = parser.parse_args(argv)
    table = QUICK if args.quick else ROWS
    if args.rows:
        wanted = args.rows.split(",")
        known = {r.name: r for r in ROWS + QUICK}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            parser.error(f"unknown rows {unknown}; known: {', '.join(known)}")
        table = tuple(known[w] for w in wanted)
    results = list(run(table))
    print("\nPlanning seconds (wall clock, this machine):")
    print("| row | " + " | ".join(COLUMNS) + " |\n|" + "---|" * (len(COLUMNS) + 1))
    for res in results:
        print(seconds_line(res))
    print("\ntorch knapsack: largest activation_memory_budget that fits: " + ", ".join(
        f"{r.row.name} {r.knapsack_fraction:.3f}" for r in results
        if r.knapsack_fraction is not None), flush=True)
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
