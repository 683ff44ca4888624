"""Operator variants under a budget (issue 6 benchmark).

VGG-16 and a GPT-style transformer (SDPA attention) at several budgets on a GPU profile:
outcore-auto decides keep/offload/recompute for the budget, then every convolution and
attention op runs with the memory-optimal variant only (framework kernel, no workspace), the
performance-optimal variant only (the fastest, if the peak still fits), or the variants
selected per step (SuperNeurons: the fastest that fits the free memory). Times are
simulated; variant speeds on GPU profiles are the assumed ratios documented in
outcore.cost.gpu_variants, workspaces are exact.

    .venv/bin/python benchmarks/variants_budget.py [--gpu titan-x-maxwell]
"""

from __future__ import annotations

import argparse
from collections import Counter

from rich.console import Console
from rich.table import Table

import outcore
from outcore import zoo
from outcore.api import cost_model_for
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.plan.memory import predicted_peak
from outcore.plan.variant_choice import choose_variants, with_variants
from outcore.sim import simulate
from outcore.units import format_bytes

WORKLOADS = [("vgg16", 64, {}), ("transformer", 8, {"attention": "sdpa", "seq_len": 1024})]
FRACTIONS = (1.2, 1.0, 0.7, 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="titan-x-maxwell")
    args = parser.parse_args()
    cost = cost_model_for(args.gpu)
    table = Table(title=f"variants under a budget ({args.gpu}, simulated)")
    for col in ("model", "budget", "variants", "fits", "peak", "step ms", "x mem-opt", "chosen"):
        table.add_column(col, justify="left" if col in ("model", "variants", "chosen") else "right")
    for name, batch, options in WORKLOADS:
        work = zoo.get(name, batch, fake=True, **options)
        graph = outcore.capture(work.model, work.loss_fn, work.batch)
        liveness = reference_peaks(graph).liveness
        for fraction in FRACTIONS:
            budget = int(liveness * fraction)
            try:
                planned = outcore.plan(graph, budget, policy="auto", cost=cost, simulate=False)
            except InfeasibleBudgetError:
                table.add_row(name, format_bytes(budget), "-", "no (offload/recompute)",
                              "", "", "", "")
                continue
            base = None
            for strategy, label in (("memory-optimal", "memory-optimal only"),
                                    ("performance-optimal", "performance-optimal only"),
                                    ("superneurons", "selected per step")):
                try:
                    chosen = choose_variants(graph, planned.schedule, cost, budget, strategy)
                except InfeasibleBudgetError:
                    table.add_row(name, format_bytes(budget), label, "no", "", "", "", "")
                    continue
                schedule = with_variants(planned.schedule, chosen)
                peak = predicted_peak(graph, schedule)
                step = simulate(graph, schedule, cost).step_time
                base = step if strategy == "memory-optimal" else base
                fits = peak <= budget
                counts = ", ".join(f"{v} {n}" for v, n in sorted(Counter(chosen.values()).items()))
                table.add_row(f"{name} (batch {batch})", format_bytes(budget), label,
                              "yes" if fits else "[red]no[/red]", format_bytes(peak),
                              f"{step * 1e3:.1f}", f"{step / base:.2f}" if base else "",
                              counts or "framework")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
