"""How long outcore-auto takes to plan (issue 15, point 4's planning-time targets).

Run: ``python benchmarks/planning_speed.py [--rows r152-pcie,ru2500,resnet20,...] [--old]
[--breakdown]``.

Rows: ResNet-152 b256 on v100-pcie in 16 GiB (the planner table's ``r152-pcie``; target
under 5 s), SuperNeurons' 2,500-unit ResNet (``outcore.sim.synthetic.residual_chain(2500)``,
10^4 forward layers, v100-pcie, half its in-core peak; target under 10 s), and three small
zoo models (``--small`` configs) at a fraction of their in-core peak.

Every model is captured once with fake tensors before any timing (capture excluded); each
figure is one ``outcore.plan(..., policy="outcore-auto", cache=False)`` call: CPU seconds of
this process (``time.process_time``, HiGHS's threads included) and of its side process
(``outcore.policies.auto.side``: PoocH and outcore-checkpoint beside outcore-optimal on two
cores; ``os.times``' children) and wall seconds. ``--serial`` plans in one process
(outcore-auto's option ``parallel=False``). The CPU
figure is the one to compare on a shared machine. ``old``: the portfolio before
outcore-optimal joined it (``CANDIDATES`` less "outcore-optimal", run with
``run_portfolio``), on the same graph in the same run; run on the big rows only with
``--old``. ``--breakdown`` prints each candidate's CPU seconds inside the portfolio.
Also printed: the simulated step of the plan, which candidate won, and the lower bound
``outcore.plan(..., bound=True)`` reports (``outcore.policies.optimal.lower_bound``, timed
apart: the CPU seconds in brackets), with the gap ("-" when a schedule built outside
``outcore.plan.lower`` beats the bound, which covers lowered plans only). ``no-skip``:
today's candidates, every one run (the portfolio before its skipping).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import outcore
from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.policies.auto import CANDIDATES, greedy_policy, run_portfolio
from outcore.policies.registry import PolicyContext, PolicyOutput, get
from outcore.sim.synthetic import residual_chain

GiB = 2**30


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], Graph]
    gpu: str
    budget: float  # GiB when above 1, else a fraction of the in-core peak
    big: bool = False


def _zoo(model: str, batch: int, small: bool) -> Callable[[], Graph]:
    def make() -> Graph:
        w = zoo.get(model, batch, fake=True, small=small)
        return capture(w.model, w.loss_fn, w.batch, fake=True, name=f"{model}-b{batch}")
    return make


CASES: tuple[Case, ...] = (
    Case("r152-pcie", _zoo("resnet152", 256, False), "v100-pcie", 16.0, big=True),
    Case("ru2500", lambda: residual_chain(2500), "v100-pcie", 0.5, big=True),
    Case("resnet20", _zoo("resnet20-cifar", 8, True), "v100-pcie", 0.5),
    Case("vgg11", _zoo("vgg11", 16, True), "v100-pcie", 0.95),
    Case("transformer", _zoo("transformer", 8, True), "v100-pcie", 0.6),
)


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (outcore-auto's side process)."""
    t = os.times()
    return t.children_user + t.children_system


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its CPU seconds (this process's and its children's) and wall seconds."""
    c0, k0, w0 = time.process_time(), _children_cpu(), time.perf_counter()
    out = fn()
    cpu = time.process_time() - c0 + _children_cpu() - k0
    return out, cpu, time.perf_counter() - w0


def _portfolio(graph: Graph, budget: int, cost: Any, names: tuple[str, ...],
               spent: dict[str, float] | None = None) -> tuple[float | None, str]:
    """Every candidate of ``names`` run (no skipping), the fastest that fits."""
    runners = {n: _clocked(greedy_policy if n == "outcore-auto" else get(n).fn, n, spent)
               for n in names}
    result = run_portfolio(graph, PolicyContext(budget=budget, cost=cost), names, runners,
                           skip=False)
    best = result.winner
    return (None, "-") if best is None else (best.seconds, best.name)


def _clocked(fn: Callable[[Graph, PolicyContext], PolicyOutput], name: str,
             spent: dict[str, float] | None) -> Callable[[Graph, PolicyContext], PolicyOutput]:
    def run(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
        c0 = time.process_time()
        try:
            return fn(graph, ctx)
        finally:
            if spent is not None:
                spent[name] = spent.get(name, 0.0) + time.process_time() - c0
    return run


def breakdown(graph: Graph, budget: int, cost: Any) -> str:
    """Each candidate's CPU seconds in the current portfolio (``run_portfolio`` directly)."""
    spent: dict[str, float] = {}
    runners = {n: _clocked(greedy_policy if n == "outcore-auto" else get(n).fn, n, spent)
               for n in CANDIDATES}
    run_portfolio(graph, PolicyContext(budget=budget, cost=cost), CANDIDATES, runners,
                  parallel=False)  # every candidate in this process, so its clock sees it
    spent.update({n: 0.0 for n in CANDIDATES if n not in spent})  # skipped
    return ", ".join(f"{n} {s:.2f}" for n, s in spent.items())


def _fresh_bound(graph: Graph, budget: int, cost: Any, step: float) -> float | None:
    """``outcore.policies.optimal.lower_bound``, what ``outcore.plan(..., bound=True)``
    reports for a plan of simulated ``step`` (first call for this graph and budget: nothing
    cached yet; the full bound model is solved only where the coarse one leaves the plan
    more than ``REFINE_ABOVE`` above it)."""
    from outcore.policies.optimal import lower_bound

    return lower_bound(graph, budget, cost, step)


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """The output and the least CPU and wall seconds of ``repeats`` calls."""
    runs = [timed(fn) for _ in range(repeats)]
    return runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs)


OLD = tuple(n for n in CANDIDATES if n != "outcore-optimal")


def run(case: Case, old: bool, split: bool, repeats: int, serial: bool = False) -> None:
    graph = case.make()
    cost = cost_model_for(case.gpu)
    peak = reference_peaks(graph).liveness
    budget = int(case.budget * GiB) if case.budget > 1 else int(case.budget * peak)
    out, cpu, wall = best_of(repeats, lambda: outcore.plan(
        graph, budget, policy="outcore-auto", cost=cost, cache=False, host_budget=None,
        parallel=not serial))
    step = out.simulation.step_time
    bound, bcpu, _ = timed(lambda: _fresh_bound(graph, budget, cost, step))
    gap = f"{(step / bound - 1) * 100:+.1f}%" if bound and bound <= step else "-"
    cells = [case.name, f"{len(graph.ops)}", f"{budget / GiB:.3g} GiB", f"{cpu:.2f}",
             f"{wall:.1f}", f"{step:.4g}", out.plan.policy,
             "-" if bound is None else f"{bound:.4g} ({bcpu:.2f} s)", gap]
    for names in (CANDIDATES, OLD):
        if old or not case.big:
            (step, name), ocpu, owall = best_of(repeats, lambda n=names: _portfolio(
                graph, budget, cost, n))
            cells += [f"{ocpu:.2f} / {owall:.1f}", "-" if step is None else f"{step:.4g} ({name})"]
        else:
            cells += ["-", "-"]
    print("| " + " | ".join(cells) + " |", flush=True)
    if split:
        print(f"  breakdown (CPU s): {breakdown(graph, budget, cost)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(c.name for c in CASES))
    ap.add_argument("--old", action="store_true", help="time the old portfolio on big rows too")
    ap.add_argument("--breakdown", action="store_true", help="per-candidate CPU seconds")
    ap.add_argument("--repeats", type=int, default=1, help="least of this many runs")
    ap.add_argument("--serial", action="store_true", help="plan in one process (no side one)")
    args = ap.parse_args(argv)
    wanted = args.rows.split(",")
    unknown = set(wanted) - {c.name for c in CASES}
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; choose from {[c.name for c in CASES]}")
    import outcore.policies.optimal  # noqa: F401  (imports are not planning time)

    print("| row | ops | budget | auto CPU s | auto wall s | step s | auto chose | bound s (CPU) | "
          "gap | no-skip CPU / wall s | no-skip step s (chose) | old CPU / wall s | "
          "old step s (chose) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        if case.name in wanted:
            run(case, args.old, args.breakdown, args.repeats, args.serial)
    return 0


if __name__ == "__main__":
    sys.exit(main())
