"""Reproduce PoocH (Ito et al., 2019) Figs. 3, 15-18 and Table 3 with outcore's ``pooch`` policy.

Run: ``.venv/bin/python benchmarks/repro_pooch.py`` (about 2 minutes on 2 cores;
``--quick``: batches 256 and 640 only, about 40 s).

ResNet-50 is captured with fake tensors at batch 128 to 640 and every schedule is simulated
on the paper's two machines: a 16 GiB V100 on PCIe 3 (``v100-pcie``, the x86 machine) and on
NVLink 2 (``v100-nvlink``, the POWER9 machine); the budget is the GPU's 16 GiB.

* Fig. 3: the step's memory against the batch size (paper: more than 50 GB at 640).
* Figs. 17 and 18: throughput of in-core (everything kept; it fits only at 128), PoocH, and
  SuperNeurons two ways: outcore's ``superneurons`` policy (the SuperNeurons paper's runtime),
  and the classification PoocH §5.2 describes as SuperNeurons' (maps kept from the output
  layer while they fit, CONV outputs swapped, the rest recomputed, each swap-in started with
  the preceding CONV layer without checking memory), run on PoocH's timeline simulation.
* Table 3: the keep / swap / recompute counts at batch 512 on both machines.
* Figs. 15 and 16: PoocH's steps one by one at batch 256 (swap-all without and with the early
  swap-in scheduling, swap-opt = step 1 only, PoocH = steps 1 and 2).

docs/repro/pooch.md explains every difference from the paper.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from outcore import zoo
from outcore.capture import capture
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph, OpCategory
from outcore.plan.lower import lower
from outcore.plan.plan import Decision
from outcore.policies import PolicyContext, baseline, get, names
from outcore.policies.common import (
    KEEP,
    RECOMPUTE,
    SWAP,
    Evaluation,
    FeatureClass,
    Profile,
    evaluate,
)
from outcore.policies.pooch import classify, just_in_time, plan_pooch
from outcore.sim import simulate

GiB = 2**30
BUDGET = 16 * GiB
BATCHES = [128, 256, 384, 512, 640]
MACHINES = [("v100-pcie", "x86 (PCIe)"), ("v100-nvlink", "POWER9 (NVLink)")]
PAPER_INCORE = 316  # img/s, Fig. 17, x86
PAPER_RANGE = {"v100-pcie": "195-316 img/s (13-38% loss)", "v100-nvlink": "2-28% loss"}
PAPER_TABLE3 = {("pooch", "v100-pcie"): (66, 12, 27),
                ("superneurons", "v100-pcie"): (66, 21, 18),
                ("pooch", "v100-nvlink"): (66, 36, 3),
                ("superneurons", "v100-nvlink"): (66, 21, 18)}


def capture_resnet50(batch: int) -> Graph:
    w = zoo.get("resnet50", batch, fake=True)
    return capture(w.model, w.loss_fn, w.batch, fake=True, name=f"resnet50-b{batch}")


def counts(classes: Mapping[int, str]) -> tuple[int, int, int]:
    c = Counter(classes.values())
    return c[KEEP], c[SWAP], c[RECOMPUTE]


# ---- SuperNeurons, two ways ---------------------------------------------------------------

def preceding_conv_rule(p: Profile):
    """SuperNeurons as PoocH re-implemented it: each swap-in starts with the computation of
    the immediately preceding CONV layer (backward), whatever the memory."""
    convs = [j for j in range(p.nf, p.n) if p.graph.ops[p.order[j]].category is OpCategory.CONV]

    def rule(prof: Profile, x: int, lo: int, need: int, memory, budget: float) -> int:
        before = [j for j in convs if lo <= j < need]
        return before[-1] if before else need

    return rule


def superneurons_as_pooch_describes(p: Profile) -> tuple[dict[int, FeatureClass], Evaluation]:
    """PoocH §5.2: keep maps from the output layer while they fit (sized with copy-ins just
    in time), swap CONV outputs and recompute the others; then run it with SuperNeurons'
    swap-in timing, which does not look at memory (an overflow is its failure)."""
    conv = {x for x in p.features if p.graph.producer_op(x).category is OpCategory.CONV}
    classes = {x: SWAP if x in conv else RECOMPUTE for x in p.features}
    for x in sorted(p.features, key=lambda x: -p.prod[x]):
        trial = {**classes, x: KEEP}
        if evaluate(p, trial, BUDGET, swap_in_at=just_in_time, sync_forward=None).feasible:
            classes = trial
    ev = evaluate(p, classes, BUDGET, swap_in_at=preceding_conv_rule(p), strict=False)
    return classes, ev


def registered_superneurons(graph: Graph, p: Profile, cost: AnalyticCostModel) -> tuple[str, tuple]:
    if "superneurons" not in names():
        return "not registered", ()
    try:
        out = get("superneurons").fn(graph, PolicyContext(budget=BUDGET, cost=cost))
    except InfeasibleBudgetError as exc:
        return f"fails (needs {exc.required / GiB:.1f} GiB)", ()
    sim = simulate(graph, out.schedule, cost)
    cls = {x: {Decision.OFFLOAD: SWAP, Decision.RECOMPUTE: RECOMPUTE}.get(
        out.plan.decisions.get(x, Decision.KEEP), KEEP) for x in p.features}
    return f"{graph_batch(graph) / sim.step_time:.0f}", counts(cls)


def graph_batch(graph: Graph) -> int:
    return int(graph.name.rsplit("-b", 1)[1])


# ---- one batch size on one machine ------------------------------------------------------------

@dataclass
class Result:
    incore: str
    pooch: str
    pooch_counts: tuple[int, int, int]
    sn_registered: str
    sn_registered_counts: tuple
    sn_described: str
    sn_described_counts: tuple[int, int, int]
    plan_s: float
    searched: str


def run(graph: Graph, machine: str) -> Result:
    cost = AnalyticCostModel(get_profile(machine))
    batch = graph_batch(graph)
    incore = simulate(graph, lower(graph, baseline.liveness(graph)), cost)
    needs = "" if incore.peak_bytes <= BUDGET else f" (needs {incore.peak_bytes / GiB:.0f} GiB)"
    incore_cell = f"{batch / incore.step_time:.0f}{needs}"
    start = time.perf_counter()
    try:
        result = plan_pooch(graph, PolicyContext(budget=BUDGET, cost=cost))
    except InfeasibleBudgetError as exc:
        return Result(incore_cell, f"fails ({exc.required / GiB:.1f})", (0, 0, 0), "", (), "",
                      (0, 0, 0), 0.0, "")
    plan_s = time.perf_counter() - start
    sim = simulate(graph, result.schedule, cost)
    c = result.classification
    p = result.profile
    described, ev = superneurons_as_pooch_describes(p)
    if ev.peak > BUDGET:
        sn_cell = f"fails (peaks at {ev.peak / GiB:.1f} GiB)"
    else:
        sn_cell = f"{batch / ev.time:.0f}"
    reg_cell, reg_counts = registered_superneurons(graph, p, cost)
    return Result(incore_cell, f"{batch / sim.step_time:.0f}", counts(c.classes), reg_cell,
                  reg_counts, sn_cell, counts(described), plan_s,
                  f"|LO| {len(c.lo)} |LI| {len(c.li)}, {c.step1_evaluations}+"
                  f"{c.step2_evaluations} sims")


def throughput_table(machine: str, label: str, results: dict[int, Result]) -> Table:
    t = Table(title=f"Fig. {17 if machine == 'v100-pcie' else 18}: ResNet-50 on {label}, img/s "
                    f"(paper: in-core {PAPER_INCORE} img/s at 128 on x86; PoocH "
                    f"{PAPER_RANGE[machine]}; SuperNeurons fails at 640)")
    for col in ("batch", "in-core", "PoocH", "keep/swap/recompute", "superneurons (policy)",
                "SuperNeurons as PoocH describes", "PoocH search", "plan s"):
        t.add_column(col, justify="right")
    for batch, r in results.items():
        t.add_row(str(batch), r.incore, r.pooch, "/".join(map(str, r.pooch_counts)),
                  r.sn_registered, r.sn_described, r.searched, f"{r.plan_s:.1f}")
    return t


def table3(results: dict[tuple[int, str], Result], batch: int) -> Table:
    t = Table(title="Table 3: feature maps classified keep / swap / recompute, "
                    f"ResNet-50 ({batch})")
    for col in ("method", "machine", "paper", "ours"):
        t.add_column(col, justify="right")
    for machine, label in MACHINES:
        r = results.get((batch, machine))
        if r is None:
            continue
        t.add_row("PoocH", label, "/".join(map(str, PAPER_TABLE3[("pooch", machine)])),
                  "/".join(map(str, r.pooch_counts)))
        t.add_row("SuperNeurons as PoocH describes", label,
                  "/".join(map(str, PAPER_TABLE3[("superneurons", machine)])),
                  "/".join(map(str, r.sn_described_counts)))
        t.add_row("superneurons (policy)", label, "",
                  "/".join(map(str, r.sn_registered_counts)) or r.sn_registered)
    return t


def ablation(graph: Graph) -> Table:
    """Figs. 15/16: speed-up of each PoocH step over swap-all without scheduling."""
    t = Table(title=f"Figs. 15/16: PoocH's steps, ResNet-50 ({graph_batch(graph)}), speed-up over "
                    "swap-all (w/o scheduling) (paper x86: swap-all +2-14%, swap-opt x1.4-3.0 over "
                    "swap-all, PoocH x1.45 over swap-opt)")
    for col in ("machine", "swap-all (w/o sched.)", "swap-all", "swap-opt", "PoocH"):
        t.add_column(col, justify="right")
    for machine, label in MACHINES:
        p = Profile(graph, [op.id for op in graph.ops], AnalyticCostModel(get_profile(machine)))
        plain = evaluate(p, {}, BUDGET, swap_in_at=just_in_time, sync_forward=None)
        early = evaluate(p, {}, BUDGET, sync_forward=None)
        opt = classify(p, BUDGET, step2_evaluations=0).evaluation
        full = classify(p, BUDGET).evaluation
        t.add_row(label, *[f"x{plain.time / ev.time:.2f}" for ev in (plain, early, opt, full)])
    return t


def memory_table(graphs: dict[int, Graph]) -> Table:
    t = Table(title="Fig. 3: ResNet-50 memory vs batch size (paper: above 50 GB at 640)")
    for col in ("batch", "every tensor held GiB", "freed at last use GiB", "fits 16 GiB in-core"):
        t.add_column(col, justify="right")
    for batch, g in graphs.items():
        peaks = reference_peaks(g)
        t.add_row(str(batch), f"{peaks.network_wide / GiB:.1f}", f"{peaks.liveness / GiB:.1f}",
                  "yes" if peaks.liveness <= BUDGET else "no")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batches 256 and 640 only")
    args = parser.parse_args(argv)
    console = Console(width=170)
    start = time.perf_counter()
    batches = [256, 640] if args.quick else BATCHES
    graphs = {b: capture_resnet50(b) for b in batches}
    console.print(memory_table(graphs))
    results: dict[tuple[int, str], Result] = {}
    for machine, label in MACHINES:
        per_batch = {b: run(graphs[b], machine) for b in batches}
        results.update({(b, machine): r for b, r in per_batch.items()})
        console.print(throughput_table(machine, label, per_batch))
    console.print(table3(results, 512 if 512 in batches else batches[-1]))
    console.print(ablation(graphs[256]))
    console.print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
