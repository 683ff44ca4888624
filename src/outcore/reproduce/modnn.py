"""Reproduce moDNN (Chen et al., DATE 2018) Figs. 6, 7 and 8 with outcore's ``modnn`` policy.

Run: ``.venv/bin/python benchmarks/repro_modnn.py`` (about 2-3 minutes on 2 cores;
``--quick``: VGG-16 and ResNet-34 for Fig. 6, fewer budgets for Fig. 8, no Fig. 7, about
40 s).

Every network is captured with fake tensors (nothing large is allocated), re-captured at the
sub-batch sizes moDNN asks for, and each schedule is simulated on the paper's GPU, a 12 GiB
Tesla K40 on PCIe 3 (``k40c`` profile: 8 GB/s each way, two copy engines). Convolution
algorithms are priced like the vDNN reproduction's cuDNN-era table
(``outcore.policies.vdnn.cudnn.relative_time``, FFT for stride 1 only) through
``outcore.policies.modnn.algos.ConvAlgorithmCost``, which re-binds to each sub-batch graph.

* Fig. 6: the "ideal case" memory (every tensor of the step held at once) against moDNN's
  lower bound Mmin (eq. 2, sub-batch size 1).
* Fig. 7: at a 12 GiB budget, the time increase over the ideal case (the sum of every task's
  time with its fastest algorithm) and the bytes moved, moDNN vs vDNN.
* Fig. 8: VGG-16 (256) and ResNet-34 (256) time against the budget for moDNN, vDNN
  (vDNN-dyn and vDNN-all) and vDNN+ (vDNN-dyn on the sub-batch moDNN's eq. 3 selects).

docs/repro/modnn.md explains every difference from the paper.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from outcore import zoo
from outcore.capture import capture
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.policies import PolicyContext, get, names
from outcore.policies.modnn import ConvAlgorithmCost, minimum_memory, plan_modnn, sub_batch
from outcore.sim import simulate
from outcore.variants.meta import conv_meta

GPU = "k40c"
GiB = 2**30
NETWORKS = [("vgg16", 256, "VGG-16"), ("vgg19", 256, "VGG-19"), ("vgg101", 128, "VGG-101"),
            ("resnet34", 256, "ResNet-34"), ("fcn", 128, "FCN")]
#: What the paper states in its text (Fig. 6 and 7 are plots without printed values).
PAPER_FIG6 = {"VGG-101": ("nearly 100 GB", "1.4 GB")}
PAPER_REDUCTION = "50x on average"
PAPER_FIG7 = {"moDNN loss": "8% average", "vDNN loss": "40% average",
              "transfer": "5x less data than vDNN on average"}
FIG8_BUDGETS = [12, 8, 6, 4, 3, 2, 1.5]


def cudnn_time(target: str, variant: str, arg_meta: Any) -> float:
    """The vDNN reproduction's cuDNN-era speeds; cuDNN 4 ran FFT for stride 1 only."""
    from outcore.policies.vdnn import relative_time

    if variant == "fft" and conv_meta(target, arg_meta).stride != (1, 1):
        return 1e9  # unsupported: never the fastest, never chosen
    return relative_time(target, variant, arg_meta)


@dataclass
class Net:
    """One network at its batch, with its sub-batch graphs captured on demand."""

    name: str
    batch: int
    label: str
    graphs: dict[int, Graph]

    def at(self, parts: int) -> Graph:
        if parts not in self.graphs:
            w = zoo.get(self.name, self.batch // parts, fake=True)
            self.graphs[parts] = capture(w.model, w.loss_fn, w.batch, fake=True,
                                         name=f"{self.name}-b{self.batch // parts}")
        return self.graphs[parts]

    def ctx(self, budget: int, cost: Any, **options: Any) -> PolicyContext:
        return PolicyContext(budget=budget, cost=cost, recapture=self.at, options=options)


def paper_cost() -> ConvAlgorithmCost:
    return ConvAlgorithmCost(AnalyticCostModel(get_profile(GPU)), relative_time=cudnn_time)


def variant_table(graph: Graph, cost: ConvAlgorithmCost) -> dict[int, list[str]]:
    """Op id -> supported variants, the table the vDNN policies read."""
    model = cost.bind(graph)
    return {op.id: list(model.table(op)) for op in graph.ops
            if op.target.startswith("aten.convolution") and len(model.table(op)) > 1}


def ideal_time(graph: Graph, cost: ConvAlgorithmCost) -> float:
    """The paper's ideal case: every task's time with its fastest algorithm, no transfers."""
    model = cost.bind(graph)
    total = 0.0
    for op in graph.ops:
        rows = model.table(op) if op.target.startswith("aten.convolution") else {}
        total += model.base.op_time(op) * (min(f for f, _ in rows.values()) if rows else 1.0)
    return total


@dataclass
class Run:
    """One policy at one budget: step time, bytes moved both ways, sub-batches, or why not."""

    time: float = float("nan")
    moved: int = 0
    parts: int = 1
    failed: str = ""


def run_modnn(net: Net, budget: int, cost: ConvAlgorithmCost) -> Run:
    try:
        result = plan_modnn(net.at(1), net.ctx(budget, cost))
    except InfeasibleBudgetError as exc:
        return Run(failed=f"needs {exc.required / GiB:.2f}")
    out = result
    sim = simulate(out.graph, out.schedule, cost)
    assert sim.peak_bytes <= budget, "moDNN must fit its budget"
    return Run(sim.step_time, sim.bytes_d2h + sim.bytes_h2d, out.schedule.sub_batches)


def run_vdnn(graph: Graph, policy: str, budget: int, cost: ConvAlgorithmCost,
             parts: int = 1) -> Run:
    if policy not in names():
        return Run(failed="not registered")
    ctx = PolicyContext(budget=budget, cost=cost, options={"variants": variant_table(graph, cost)})
    try:
        out = get(policy).fn(graph, ctx)
    except InfeasibleBudgetError as exc:
        return Run(failed=f"needs {exc.required / GiB:.2f}")
    sim = simulate(out.graph, out.schedule, cost)
    if sim.peak_bytes > budget:
        return Run(failed=f"peak {sim.peak_bytes / GiB:.2f}")
    return Run(sim.step_time * parts, (sim.bytes_d2h + sim.bytes_h2d) * parts, parts)


def run_vdnn_plus(net: Net, budget: int, cost: ConvAlgorithmCost) -> Run:
    """vDNN+: moDNN's sub-batch selection (eq. 3), then vDNN-dyn on that sub-batch."""
    try:
        parts = sub_batch(net.at(1), net.ctx(budget, cost)).parts
    except InfeasibleBudgetError as exc:
        return Run(failed=f"needs {exc.required / GiB:.2f}")
    return run_vdnn(net.at(parts), "vdnn-dyn", budget, cost, parts)


# ---- tables ------------------------------------------------------------------------------------

def fig6(nets: list[Net], cost: ConvAlgorithmCost) -> Table:
    t = Table(title=f"Fig. 6: ideal-case memory vs moDNN's lower bound Mmin (paper: reduction "
                    f"{PAPER_REDUCTION}; VGG-101 ideal nearly 100 GB, Mmin 1.4 GB)")
    for col in ("network", "batch", "ideal GiB (all held)", "free-at-last-use GiB", "Mmin GiB",
                "SW GiB", "ideal / Mmin", "paper"):
        t.add_column(col, justify="right")
    ratios = []
    for net in nets:
        peaks = reference_peaks(net.at(1))
        mmin = minimum_memory(net.at(1), net.ctx(12 * GiB, cost))
        ratios.append(peaks.network_wide / mmin.minimum)
        paper = PAPER_FIG6.get(net.label)
        t.add_row(net.label, str(net.batch), f"{peaks.network_wide / GiB:.1f}",
                  f"{peaks.liveness / GiB:.1f}", f"{mmin.minimum / GiB:.2f}",
                  f"{mmin.sw / GiB:.2f}", f"{ratios[-1]:.0f}x",
                  f"{paper[0]} / {paper[1]}" if paper else "")
    t.add_row("mean", "", "", "", "", "", f"{statistics.mean(ratios):.0f}x", PAPER_REDUCTION)
    return t


def fig7(nets: list[Net], cost: ConvAlgorithmCost) -> Table:
    t = Table(title="Fig. 7: 12 GiB budget: time increase over the ideal case and bytes moved "
                    f"(paper: moDNN {PAPER_FIG7['moDNN loss']}, vDNN {PAPER_FIG7['vDNN loss']}, "
                    f"moDNN moves {PAPER_FIG7['transfer']})")
    for col in ("network", "moDNN k", "moDNN loss", "moDNN moved GiB", "vDNN-dyn loss",
                "vDNN-dyn moved GiB", "vDNN-all loss", "vDNN-all moved GiB"):
        t.add_column(col, justify="right")
    losses: dict[str, list[float]] = {"modnn": [], "dyn": [], "all": []}
    for net in nets:
        ideal = ideal_time(net.at(1), cost)
        runs = {"modnn": run_modnn(net, 12 * GiB, cost),
                "dyn": run_vdnn(net.at(1), "vdnn-dyn", 12 * GiB, cost),
                "all": run_vdnn(net.at(1), "vdnn-all", 12 * GiB, cost)}
        cells = []
        for key, r in runs.items():
            if r.failed:
                cells += [f"fails ({r.failed})", ""]
                continue
            losses[key].append(r.time / ideal - 1)
            cells += [f"{r.time / ideal - 1:+.0%}", f"{r.moved / GiB:.1f}"]
        t.add_row(net.label, str(runs["modnn"].parts), *cells)
    means = [f"{statistics.mean(losses[k]):+.0%}" if losses[k] else "-" for k in losses]
    t.add_row("mean", "", means[0], "", means[1], "", means[2], "")
    return t


def fig8(net: Net, budgets: list[float], cost: ConvAlgorithmCost) -> Table:
    ideal = ideal_time(net.at(1), cost)
    mmin = minimum_memory(net.at(1), net.ctx(12 * GiB, cost)).minimum
    t = Table(title=f"Fig. 8: {net.label} ({net.batch}) time vs budget, normalised to the ideal "
                    f"case ({ideal:.2f} s); Mmin = {mmin / GiB:.2f} GiB")
    for col in ("budget GiB", "moDNN k", "moDNN", "moDNN moved GiB", "vDNN-dyn", "vDNN-all",
                "vDNN+ k", "vDNN+"):
        t.add_column(col, justify="right")

    def cell(r: Run) -> str:
        return f"fails ({r.failed})" if r.failed else f"{r.time / ideal:.2f}"

    for gib in [*budgets, mmin / GiB]:
        budget = int(gib * GiB)
        m = run_modnn(net, budget, cost)
        dyn = run_vdnn(net.at(1), "vdnn-dyn", budget, cost)
        full = run_vdnn(net.at(1), "vdnn-all", budget, cost)
        plus = run_vdnn_plus(net, budget, cost)
        t.add_row(f"{gib:.2f}", str(m.parts), cell(m), "" if m.failed else f"{m.moved / GiB:.1f}",
                  cell(dyn), cell(full), "" if plus.failed else str(plus.parts), cell(plus))
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer networks and budgets")
    args = parser.parse_args(argv)
    console = Console(width=160)
    start = time.perf_counter()
    cost = paper_cost()
    chosen = [n for n in NETWORKS if not args.quick or n[0] in ("vgg16", "resnet34")]
    nets = [Net(name, batch, label, {}) for name, batch, label in chosen]
    console.print(fig6(nets, cost))
    if not args.quick:
        console.print(fig7(nets, cost))
    budgets = [12, 6, 3, 1.5] if args.quick else FIG8_BUDGETS
    console.print(fig8(nets[0], budgets, cost))
    if not args.quick:  # a network whose full batch vDNN can train in 12 GiB
        resnet = next(n for n in nets if n.name == "resnet34")
        console.print(fig8(resnet, [12, 8, 6, 4, 2, 1, 0.5], cost))
    console.print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
