"""Budget fidelity as users measure it (issue 19, point 4).

For each model: the in-core peak (everything on the device, each tensor freed at its last
use, as eager PyTorch does: outcore-auto without a budget; above it no plan changes) and the
lowest budget outcore-auto accepts (bisection on bytes); 20 budgets evenly spaced between
them. At every budget:

* outcore-auto plans (``planned``) and its schedule runs on the CPU-emulated device whose
  capacity *is* the budget (an allocation past it raises), so ``measured`` is the peak the
  tracker saw; the step must succeed and ``measured <= budget``, ``measured == planned``;
* every policy plans too (no run), to check monotonicity: lowering the budget never
  raises a policy's planned peak, and a budget that a policy accepts stays accepted above
  it ("feasible, then infeasible at a larger budget" is a violation);
* with ``--ladder``, outcore-auto with ``monotone=True`` (``outcore.policies.auto_ladder``)
  is checked the same way.

    .venv/bin/python benchmarks/budget_fidelity.py [--budgets 20] [--models a,b] [--ladder]

Prints the curve per model and a summary; the exit status is 1 when any violation is found
(outcore-auto without the ladder has some: see ``auto_ladder``'s docstring).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

import outcore
from outcore import zoo
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph
from outcore.runtime.devices import EmulatedDevice
from outcore.runtime.executor import Executor

MODELS = [("resnet20-cifar", 8, {}),
          ("googlenet", 2, {"small": True}), ("vgg11", 4, {"small": True}),
          ("transformer", 4, {"small": True}), ("alexnet", 4, {"small": True}),
          ("inception-small", 4, {})]
SKIP = {"keep-all", "modnn"}  # keep-all ignores budgets; modnn re-captures (sub-batches)


@dataclass
class Curve:
    """One model's budgets (descending), outcore-auto's planned and measured peaks, and the
    monotonicity violations of every policy."""

    name: str
    in_core: int
    lowest: int
    rows: list[tuple[int, int, int]] = field(default_factory=list)  # budget, planned, measured
    violations: list[str] = field(default_factory=list)
    ladder: list[str] | None = None  # violations of outcore-auto with monotone=True


def planned_peak(graph: Graph, budget: int, policy: str, **options: object) -> int | None:
    try:
        return outcore.plan(graph, budget, policy=policy, simulate=False,
                            **options).predicted_peak
    except InfeasibleBudgetError:  # infeasibility only; any other error is a bug
        return None


def lowest_budget(graph: Graph, high: int, policy: str = "outcore-auto") -> int:
    """The least budget ``policy`` accepts, by bisection (feasibility is monotone: checked)."""
    lo, hi = 0, high
    while hi - lo > max(64, high // 2000):
        mid = (lo + hi) // 2
        if planned_peak(graph, mid, policy) is None:
            lo = mid
        else:
            hi = mid
    return hi


def monotone_violations(budgets: list[int], peaks: list[int | None], policy: str) -> list[str]:
    """Budgets ascending; a peak that falls as the budget rises, or a budget accepted below
    one that is refused, is a violation."""
    out = []
    for (b0, p0), (b1, p1) in zip(zip(budgets, peaks, strict=True),
                                  zip(budgets[1:], peaks[1:], strict=True), strict=False):
        if p0 is not None and p1 is None:
            out.append(f"{policy}: accepts {b0} B but refuses {b1} B")
        elif p0 is not None and p1 is not None and p1 < p0:
            out.append(f"{policy}: peak {p0} B at budget {b0} but {p1} B at {b1}")
    return out


def measure(graph: Graph, budget: int) -> tuple[int, int]:
    """(planned, measured) peak of outcore-auto at ``budget`` on an emulated device of that
    capacity."""
    planned = outcore.plan(graph, budget, simulate=False)
    device = EmulatedDevice(budget, 1e10, 1e10)
    try:
        result = Executor(planned.graph, planned.schedule, device).run(
            graph.meta["_batch"], apply=False)
    finally:
        device.close()
    return planned.predicted_peak, result.peak_bytes


def curve(name: str, graph: Graph, n: int, policies: list[str], ladder: bool = False) -> Curve:
    in_core = outcore.plan(graph, None, simulate=False).predicted_peak
    lowest = lowest_budget(graph, in_core)
    budgets = sorted({lowest + (in_core - lowest) * i // (n - 1) for i in range(n)})
    result = Curve(name, in_core, lowest)
    for budget in reversed(budgets):
        planned, measured = measure(graph, budget)
        result.rows.append((budget, planned, measured))
        if measured > budget or measured != planned:
            result.violations.append(f"outcore-auto at {budget} B: planned {planned}, "
                                     f"measured {measured}")
    for policy in policies:
        peaks = [planned_peak(graph, b, policy) for b in budgets]
        result.violations += monotone_violations(budgets, peaks, policy)
    if ladder:
        peaks = [planned_peak(graph, b, "outcore-auto", monotone=True) for b in budgets]
        result.ladder = monotone_violations(budgets, peaks, "outcore-auto monotone=True")
    return result


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--budgets", type=int, default=20)
    args.add_argument("--models", default=",".join(m for m, _, _ in MODELS))
    args.add_argument("--ladder", action="store_true",
                      help="also check outcore-auto with monotone=True (policies.auto_ladder)")
    opts = args.parse_args(argv)
    console = Console(width=110)
    policies = [p for p in outcore.policies() if p not in SKIP]
    chosen = opts.models.split(",")
    total = ladder_total = 0
    for name, batch_size, kw in MODELS:
        if name not in chosen:
            continue
        w = zoo.get(name, batch_size, **kw)
        graph = capture(w.model, w.loss_fn, w.batch)
        graph.meta["_batch"] = w.batch
        c = curve(f"{name} (batch {batch_size})", graph, opts.budgets, policies, opts.ladder)
        table = Table(title=f"{c.name}: in-core {c.in_core} B, lowest feasible {c.lowest} B")
        for col in ("budget B", "planned B", "measured B", "measured/budget"):
            table.add_column(col, justify="right")
        for budget, planned, measured in c.rows:
            table.add_row(str(budget), str(planned), str(measured), f"{measured / budget:.3f}")
        console.print(table)
        console.print(f"monotonicity checked for {len(policies)} policies; violations: "
                      f"{len(c.violations)}")
        for v in c.violations:
            console.print(f"  [red]{v}[/red]")
        total += len(c.violations)
        if c.ladder is not None:
            console.print(f"outcore-auto monotone=True: violations {len(c.ladder)}")
            ladder_total += len(c.ladder)
    console.print(f"total violations: {total}")
    if opts.ladder:
        console.print(f"outcore-auto monotone=True, total violations: {ladder_total}")
    return 1 if total or ladder_total else 0


if __name__ == "__main__":
    sys.exit(main())
