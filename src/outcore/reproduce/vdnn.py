"""Reproduce vDNN (Rhu et al., MICRO 2016) Figs. 11, 12, 14 and 15 with outcore's vDNN policies.

Run: ``.venv/bin/python benchmarks/repro_vdnn.py`` (about 30 s on 2 idle cores, up to about
1.5 minutes on a busy machine; ``--quick``: AlexNet, VGG-16 (64) and VGG-16/116 at batch 32
only, about 5 s).

Every network is captured with fake tensors (nothing large is allocated) and each policy's
schedule is simulated on the paper's GPU, a 12 GiB Maxwell Titan X on PCIe 3 (12.8 GB/s each
way), with cuDNN-4-era convolution algorithms (``outcore.policies.vdnn.cudnn``: implicit
GEMM = the memory-optimal "framework" kernel; GEMM and FFT faster with workspace).

For each network and policy it prints the maximum and (time-weighted) average device memory
(Fig. 11), the bytes offloaded to the host (Fig. 12) and the performance relative to the
oracular baseline: the baseline's step with the fastest algorithms on a GPU without a memory
limit (Fig. 14). Then the paper's averaged claims next to ours, and the VGG-116..416 study at
batch 32 (Fig. 15). docs/repro/vdnn.md explains every difference.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from outcore.graph.ir import Graph
from outcore.policies import PolicyContext
from outcore.policies.vdnn import (
    TARGETS,
    CudnnAlgorithms,
    VdnnAlgo,
    VdnnConfig,
    VdnnMode,
    VdnnResult,
    plan_dyn,
    plan_static,
)
from outcore.sim import simulate
from outcore.variants.torchmeta import arg_meta_of

GPU = "titan-x-maxwell"
MiB = 2**20

#: (zoo name, batch, zoo options, label). The Facebook convnet-benchmarks reference models
#: vDNN uses have no LRN and no grouped convolutions; see docs/repro/vdnn.md.
NETWORKS = [
    ("alexnet", 128, {"lrn": False, "grouped": False}, "AlexNet (128)"),
    ("overfeat", 128, {}, "OverFeat (128)"),
    ("googlenet", 128, {"lrn": False}, "GoogLeNet (128)"),
    ("vgg16", 64, {}, "VGG-16 (64)"),
    ("vgg16", 128, {}, "VGG-16 (128)"),
    ("vgg16", 256, {}, "VGG-16 (256)"),
]
DEEP = [("vgg16", "VGG-16"), ("vgg116", "VGG-116"), ("vgg216", "VGG-216"),
        ("vgg316", "VGG-316"), ("vgg416", "VGG-416")]
POLICIES = [("base", "m"), ("base", "p"), ("all", "m"), ("all", "p"), ("conv", "m"),
            ("conv", "p"), ("dyn", "")]

#: Numbers the paper states in its text (Sec. V), quoted for comparison.
PAPER_AVERAGES = {  # policy -> (max reduction, avg reduction), six networks, Sec. V-A
    "all(m)": (0.73, 0.93), "all(p)": (0.64, 0.90), "conv(p)": (0.52, 0.76), "dyn": (0.49, 0.69),
}
PAPER_PERF = {"all(m)": (0.58, 0.65), "conv(m)": (0.55, 0.63)}  # mean and max loss, Sec. V-C


# ---- shared with repro_superneurons.py -------------------------------------------------------

def capture_fake(name: str, batch: int, **options: Any) -> Graph:
    """``name`` at ``batch`` captured with fake tensors."""
    w = zoo.get(name, batch, fake=True, **options)
    return capture(w.model, w.loss_fn, w.batch, fake=True, name=f"{name}-b{batch}")


def paper_gpu(graph: Graph, gpu: str = GPU) -> tuple[AnalyticCostModel, dict[int, list[str]]]:
    """The analytic cost model of ``gpu`` pricing cuDNN-4-era convolution algorithms, and the
    supported-variants table the vDNN / SuperNeurons policies read."""
    meta = {op.id: arg_meta_of(node.args)
            for op, node in zip(graph.ops, graph.source.op_nodes, strict=True)
            if op.target in TARGETS}
    algos = CudnnAlgorithms.for_graph(graph, meta)
    return AnalyticCostModel(get_profile(gpu), variants=algos), algos.supported()


def mib(nbytes: float) -> str:
    """MiB, the paper's "MB" (its figures' axes; 12 GB is the Titan X's 12 GiB)."""
    return f"{nbytes / MiB:,.0f}"


# ---- one network ----------------------------------------------------------------------------

@dataclass
class Row:
    policy: str
    peak: int
    average: float
    offloaded: int
    step: float
    host: int
    fits: bool
    note: str = ""


def run_policy(graph: Graph, cost: Any, table: dict[int, list[str]], mode: str, algo: str,
               budget: int) -> Row:
    label = "dyn" if mode == "dyn" else f"{mode}({algo})"
    unlimited = PolicyContext(cost=cost, config=VdnnConfig(variants=table))
    if mode == "dyn":
        try:
            r: VdnnResult = plan_dyn(graph, dataclasses.replace(unlimited, budget=budget))
            note = f"chose {r.mode}, phase {r.phase}"
        except InfeasibleBudgetError as exc:
            r = plan_static(graph, unlimited, VdnnMode.ALL, VdnnAlgo.MEMORY)
            note = f"untrainable: needs {mib(exc.required)} MiB"
    else:
        r = plan_static(graph, unlimited, mode, algo)
        note = ""
    sim = simulate(graph, r.schedule, cost)
    fits = sim.peak_bytes <= budget and not note.startswith("untrainable")
    return Row(label, sim.peak_bytes, sim.average_bytes, sim.bytes_d2h, sim.step_time,
               sim.host_peak_bytes, fits, note)


def run_network(name: str, batch: int, options: dict[str, Any]) -> tuple[list[Row], float]:
    graph = capture_fake(name, batch, **options)
    cost, table = paper_gpu(graph)
    budget = get_profile(GPU).memory
    rows = [run_policy(graph, cost, table, mode, algo, budget) for mode, algo in POLICIES]
    oracle = next(r.step for r in rows if r.policy == "base(p)")
    return rows, oracle


def network_table(label: str, rows: list[Row], oracle: float) -> Table:
    t = Table(title=f"{label}: memory (Fig. 11), offload (Fig. 12), performance (Fig. 14)")
    for col in ("policy", "max MiB", "avg MiB", "offloaded MiB", "perf vs oracle", "note"):
        t.add_column(col, justify="left" if col in ("policy", "note") else "right")
    for r in rows:
        star = "" if r.fits else " *"
        perf = "-" if r.note.startswith("untrainable") else f"{oracle / r.step:.2f}"
        t.add_row(r.policy + star, mib(r.peak), mib(r.average), mib(r.offloaded), perf, r.note)
    return t


def averages_table(results: dict[str, list[Row]]) -> Table:
    t = Table(title="Sec. V averages over the networks run: paper vs ours "
                    "(reduction vs the baseline with the same algorithms; dyn vs base(p), "
                    "over the networks it can train)")
    for col in ("policy", "max reduction paper", "ours", "avg reduction paper", "ours"):
        t.add_column(col, justify="right")
    for policy, (pmax, pavg) in PAPER_AVERAGES.items():
        base = "base(m)" if policy.endswith("(m)") else "base(p)"
        maxes, avgs = [], []
        for rows in results.values():
            by = {r.policy: r for r in rows}
            if by[policy].note.startswith("untrainable"):
                continue  # no schedule to measure
            maxes.append(1 - by[policy].peak / by[base].peak)
            avgs.append(1 - by[policy].average / by[base].average)
        t.add_row(policy, f"{pmax:.0%}", f"{statistics.mean(maxes):.0%}", f"{pavg:.0%}",
                  f"{statistics.mean(avgs):.0%}")
    return t


def perf_table(results: dict[str, list[Row]], oracles: dict[str, float]) -> Table:
    t = Table(title="Sec. V-C performance loss vs the oracular baseline: paper vs ours")
    for col in ("policy", "mean loss paper", "ours", "max loss paper", "ours"):
        t.add_column(col, justify="right")
    losses: dict[str, list[float]] = {}
    for label, rows in results.items():
        for r in rows:
            losses.setdefault(r.policy, []).append(1 - oracles[label] / r.step)
    for policy, (mean, worst) in PAPER_PERF.items():
        t.add_row(policy, f"{mean:.0%}", f"{statistics.mean(losses[policy]):.0%}",
                  f"{worst:.0%}", f"{max(losses[policy]):.0%}")
    dyn = [oracles[k] / r.step for k, rows in results.items() for r in rows
           if r.policy == "dyn" and r.fits]
    t.add_row("dyn (throughput)", "97% mean, 82% worst", f"{statistics.mean(dyn):.0%} mean, "
              f"{min(dyn):.0%} worst (trainable ones)", "", "")
    return t


def claims_table(results: dict[str, list[Row]], oracles: dict[str, float]) -> Table | None:
    """The paper's specific numbers for VGG-16 next to ours."""
    by = {label: {r.policy: r for r in rows} for label, rows in results.items()}
    if "VGG-16 (128)" not in by or "VGG-16 (256)" not in by:
        return None
    v128, v256 = by["VGG-16 (128)"], by["VGG-16 (256)"]
    t = Table(title="Specific claims of Sec. V (paper MB = MiB)")
    for col in ("claim", "paper", "ours"):
        t.add_column(col, justify="left" if col == "claim" else "right")
    t.add_row("VGG-16 (128) base(p) needs", "15 GB", f"{mib(v128['base(p)'].peak)} MiB")
    t.add_row("VGG-16 (256) base(p) needs", "28 GB", f"{mib(v256['base(p)'].peak)} MiB")
    t.add_row("VGG-16 (128) all(m) max memory", "4.8 GB", f"{mib(v128['all(m)'].peak)} MiB")
    t.add_row("VGG-16 (128) all(m) performance loss", "61%",
              f"{1 - oracles['VGG-16 (128)'] / v128['all(m)'].step:.0%}")
    t.add_row("VGG-16 (256) all offload size (Fig. 12)", "about 16 GB",
              f"{mib(v256['all(m)'].offloaded)} MiB")
    t.add_row("VGG-16 (256) trainable with vDNN on 12 GB", "yes (dyn, 82%)",
              "yes" if v256["dyn"].fits else v256["dyn"].note)
    return t


def deep_table(deep: list[tuple[str, str]]) -> Table:
    t = Table(title="Fig. 15: VGG-style very deep networks, batch 32, 12 GiB Titan X (paper: "
                    "baseline 4.9 GB for VGG-16 -> 67.1 GB for VGG-416; vDNN-dyn <= 4.2 GB "
                    "GPU-side, no slowdown)")
    for col in ("network", "base(m) MiB", "base(p) MiB", "dyn GPU max MiB", "dyn host MiB",
                "dyn chose", "dyn perf vs oracle"):
        t.add_column(col, justify="right")
    budget = get_profile(GPU).memory
    for name, label in deep:
        graph = capture_fake(name, 32)
        cost, table = paper_gpu(graph)
        base_m = run_policy(graph, cost, table, "base", "m", budget)
        base = run_policy(graph, cost, table, "base", "p", budget)
        dyn = run_policy(graph, cost, table, "dyn", "", budget)
        t.add_row(label, mib(base_m.peak) + ("" if base_m.fits else " *"),
                  mib(base.peak) + ("" if base.fits else " *"), mib(dyn.peak),
                  mib(dyn.host), dyn.note, f"{base.step / dyn.step:.2f}")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="AlexNet, VGG-16 (64), and VGG-16/116 at batch 32")
    args = parser.parse_args(argv)
    console = Console(width=150)
    start = time.perf_counter()
    networks = [n for n in NETWORKS if n[3] in ("AlexNet (128)", "VGG-16 (64)")] \
        if args.quick else NETWORKS
    deep = DEEP[:2] if args.quick else DEEP
    results: dict[str, list[Row]] = {}
    oracles: dict[str, float] = {}
    for name, batch, options, label in networks:
        rows, oracle = run_network(name, batch, options)
        results[label], oracles[label] = rows, oracle
        console.print(network_table(label, rows, oracle))
    console.print("* = does not fit the 12 GiB Titan X (the paper's failing configurations)")
    console.print(averages_table(results))
    console.print(perf_table(results, oracles))
    claims = claims_table(results, oracles)
    if claims is not None:
        console.print(claims)
    console.print(deep_table(deep))
    console.print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
