"""Reproduce SuperNeurons (Wang et al., PPoPP 2018) Fig. 10 and Tables 1, 4 and 5 with outcore's
``superneurons`` policy.

Run: ``.venv/bin/python benchmarks/repro_superneurons.py`` (about 2.5 minutes on 2 cores;
``--quick``: fewer networks and depths, about 35 s; ``--verify-depth``: also capture the
ResNet at the predicted deepest depth and plan it, several extra minutes).

Every network is captured with fake tensors (nothing large is allocated); memory is
``outcore.plan.memory``'s rule, the one the executor measures. Two accountings are printed:
"device" is everything the device holds (parameters, input batch, parameter gradients
included); "data" leaves out the parameters, the input batch and the parameter gradients,
which is what the paper's Fig. 10 counts (its 2189 MB baseline is the sum of every layer's
output and output gradient of AlexNet at batch 200). MB below are MiB, as in the paper
(its CONV1 output, 200x96x55x55 floats, is "221.56MB").

* Fig. 10: AlexNet (200), the techniques stacked: network-wide baseline, liveness, offloading
  CONV outputs (eager, no tensor cache), cost-aware recomputation.
* Table 1: recomputations and peak of speed-centric, memory-centric and cost-aware
  recomputation (with liveness and eager offloading, as Fig. 10c) on AlexNet (200),
  ResNet-50 (32) and ResNet-101 (32).
* Table 4: the deepest bottleneck ResNet (SuperNeurons' rule: stages (6, 32, n3, 6)) that
  trains at batch 16 in a 12 GiB K40c, with the full policy (tensor cache). A capture takes
  about 4 ms per op, so depths of thousands of layers are not searched by capture: the least
  budget is measured at a few depths and extrapolated linearly (it is affine in the number of
  units, which the middle point checks); ``--verify-depth`` captures the predicted depth.
* Table 5: the largest batch per network in 12 GiB. Every tensor size of these networks is
  affine in the batch, so each network is captured at two batch sizes and the graph at any
  batch is interpolated exactly (checked against a direct capture); the batch is bisected.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from outcore.cost.profiles import get_profile
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import STATIC_KINDS, Graph
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.policies import PolicyContext, baseline
from outcore.policies.superneurons import (
    Recompute,
    SuperNeuronsResult,
    least_budget,
    plan_superneurons,
)
from outcore.reproduce.vdnn import capture_fake

MiB = 2**20
GPU = "k40c"

PAPER_FIG10 = {"baseline": 2189.437, "liveness": 1489.355, "+offload": 1132.155,
               "+recompute": 886.385}
PAPER_TABLE1 = {  # network -> {strategy: (extra recomputations, peak MB)}
    "AlexNet (200)": {"speed": (14, 993.018), "memory": (23, 886.23), "cost-aware": (17, 886.23)},
    "ResNet-50 (32)": {"speed": (84, 455.125), "memory": (118, 401), "cost-aware": (85, 401)},
    "ResNet-101 (32)": {"speed": (169, 455.125), "memory": (237, 401), "cost-aware": (170, 401)},
}
PAPER_TABLE5 = {"AlexNet": 1792, "VGG-16": 224, "Inception-v4": 240, "ResNet-50": 384,
                "ResNet-101": 256, "ResNet-152": 176}
TABLE5: list[tuple[str, str, dict[str, Any]]] = [
    ("alexnet", "AlexNet", {}), ("vgg16", "VGG-16", {}), ("inception-v4", "Inception-v4", {}),
    ("resnet50", "ResNet-50", {}), ("resnet101", "ResNet-101", {}), ("resnet152", "ResNet-152", {})]


def mib(nbytes: float) -> str:
    return f"{nbytes / MiB:,.0f}"


def data_only(graph: Graph) -> Graph:
    """``graph`` with static tensors and parameter gradients weighing nothing (paper's count)."""
    light = {t.storage for t in graph.tensors
             if t.kind in STATIC_KINDS or t.source.startswith("grad:")}
    tensors = [dataclasses.replace(t, nbytes=0) if t.id in light else t for t in graph.tensors]
    return dataclasses.replace(graph, tensors=tensors)


# ---- Fig. 10 and Table 1 ----------------------------------------------------------------------

STAGES: list[tuple[str, dict[str, Any]]] = [
    ("liveness", {"recompute": "none", "offload": False}),
    ("+offload", {"recompute": "none", "tensor_cache": False}),
    ("+recompute", {"recompute": "cost-aware", "tensor_cache": False}),
]


def _plan(graph: Graph, budget: int | None = None, **options: Any) -> SuperNeuronsResult:
    """SuperNeurons for ``budget`` with ``options`` (as the user spells them)."""
    return plan_superneurons(graph, PolicyContext(budget=budget, options=options))


def fig10(console: Console, graph: Graph, label: str) -> None:
    light = data_only(graph)
    keep_all = lower(graph, baseline.keep_all(graph))
    rows: list[tuple[str, int, int, SuperNeuronsResult | None]] = [
        ("baseline", predicted_peak(graph, keep_all), predicted_peak(light, keep_all), None)]
    for stage, options in STAGES:
        r = _plan(graph, **options)
        rows.append((stage, r.peak, predicted_peak(light, r.schedule), r))
    last = rows[-1][3]
    t = Table(title=f"Fig. 10: {label}, peak memory as the techniques stack up (MiB)")
    for col in ("stage", "paper (data)", "ours (data)", "ours (device)", "offloaded", "recomputed"):
        t.add_column(col, justify="right")
    for stage, device, data, row in rows:
        paper = PAPER_FIG10.get(stage) if "LRN" in label else None
        t.add_row(stage, f"{paper:,.0f}" if paper else "-", mib(data), mib(device),
                  mib(row.stats.offload_bytes) if row else "-",
                  str(row.recomputations) if row else "-")
    console.print(t)
    assert last is not None
    console.print(f"  l_peak (largest op, non-static bytes): {mib(last.segmentation.l_peak)} MiB "
                  f"(paper: max(l_i) = 886 MB at the backward LRN1); segments: "
                  f"{sum(s.strategy is Recompute.MEMORY for s in last.segmentation.segments)} "
                  f"memory-centric of {len(last.segmentation.segments)}")


def table1(console: Console, graphs: dict[str, Graph]) -> None:
    t = Table(title="Table 1: recomputation strategies (with liveness and eager offloading): "
                    "extra recomputations and peak (MiB, data accounting)")
    t.add_column("network")
    for strategy in ("speed", "memory", "cost-aware"):
        t.add_column(f"{strategy} extra paper/ours", justify="right")
        t.add_column(f"{strategy} peak paper/ours", justify="right")
    for label, graph in graphs.items():
        light = data_only(graph)
        cells = [label]
        for strategy in ("speed", "memory", "cost-aware"):
            r = _plan(graph, recompute=strategy, tensor_cache=False)
            extra, peak = PAPER_TABLE1[label][strategy]
            cells += [f"{extra} / {r.recomputations}",
                      f"{peak:,.0f} / {mib(predicted_peak(light, r.schedule))}"]
        t.add_row(*cells)
    console.print(t)


# ---- Table 4: going deeper --------------------------------------------------------------------

def table4(console: Console, units: list[int], budget: int, verify: bool) -> None:
    needs, live = {}, {}
    for u in units:
        graph = capture_fake("resnet-units", 16, units=u)
        needs[u] = least_budget(graph)
        live[u] = _plan(graph, recompute="none", offload=False).peak
    slope, at = _fit(units[0], needs[units[0]], units[-1], needs[units[-1]])
    lslope, lat = _fit(units[0], live[units[0]], units[-1], live[units[-1]])
    t = Table(title="Table 4: deepest bottleneck ResNet at batch 16 in 12 GiB "
                    "(depth = 3 * units + 2; paper: SuperNeurons 1920, TensorFlow 592, "
                    "MXNet 480, Torch 152, Caffe 148)")
    for col in ("units", "depth", "superneurons least budget MiB", "liveness peak MiB"):
        t.add_column(col, justify="right")
    for u in units:
        t.add_row(str(u), str(3 * u + 2), mib(needs[u]), mib(live[u]))
    console.print(t)
    if len(units) > 2:
        mid = units[1]
        off = needs[mid] - (at + slope * mid)
        console.print(f"  linearity check at {mid} units: measured - fitted = {mib(off)} MiB")
    deepest = int((budget - at) // slope)
    deepest_live = int((budget - lat) // lslope)
    console.print(f"  superneurons: {slope / MiB:.1f} MiB per unit -> deepest "
                  f"{deepest} units = depth {3 * deepest + 2} (paper 1920); liveness alone "
                  f"(what a framework freeing at last use reaches): depth {3 * deepest_live + 2}")
    if verify:
        graph = capture_fake("resnet-units", 16, units=deepest)
        ok = _fits(lambda: _plan(graph, budget=budget))
        console.print(f"  verified by capture at {deepest} units: "
                      f"{'fits' if ok else 'does NOT fit'} in 12 GiB")


def _fit(x0: int, y0: int, x1: int, y1: int) -> tuple[float, float]:
    slope = (y1 - y0) / (x1 - x0)
    return slope, y0 - slope * x0


def _fits(plan: Callable[[], object]) -> bool:
    try:
        plan()
        return True
    except InfeasibleBudgetError:
        return False


# ---- Table 5: going wider ---------------------------------------------------------------------

def batch_affine(g1: Graph, b1: int, g2: Graph, b2: int) -> Callable[[int], Graph]:
    """The graph at any batch, from captures at ``b1`` and ``b2`` (every size affine in it)."""
    if [o.target for o in g1.ops] != [o.target for o in g2.ops] or \
            [t.name for t in g1.tensors] != [t.name for t in g2.tensors]:
        raise ValueError(f"{g1.name} and {g2.name} differ in structure: not batch-affine")
    db = b2 - b1

    def lerp(v1: int, v2: int, b: int) -> int:
        if (v2 - v1) % db:
            raise ValueError(f"a size goes {v1} -> {v2} from batch {b1} to {b2}: not affine")
        return v1 + (v2 - v1) // db * (b - b1)

    def at(b: int) -> Graph:
        tensors = [dataclasses.replace(t, nbytes=lerp(t.nbytes, u.nbytes, b),
                                       shape=tuple(lerp(x, y, b)
                                                   for x, y in zip(t.shape, u.shape, strict=True)))
                   for t, u in zip(g1.tensors, g2.tensors, strict=True)]
        ops = [dataclasses.replace(o, flops=o.flops + (p.flops - o.flops) / db * (b - b1))
               for o, p in zip(g1.ops, g2.ops, strict=True)]
        return dataclasses.replace(g1, tensors=tensors, ops=ops, name=f"{g1.name}@{b}",
                                   source=None)

    return at


def same_sizes(a: Graph, b: Graph) -> bool:
    return [t.nbytes for t in a.tensors] == [t.nbytes for t in b.tensors]


def largest_batch(at: Callable[[int], Graph], budget: int, hi: int = 4096) -> int:
    """Bisect the largest batch whose graph the policy plans within ``budget``."""
    def ok(b: int) -> bool:
        return _fits(lambda: _plan(at(b), budget=budget))

    lo = 0
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def table5(console: Console, networks: list[tuple[str, str, dict]], budget: int) -> None:
    t = Table(title="Table 5: largest batch in 12 GiB (paper: SuperNeurons on a K40; "
                    "TensorFlow, the next best, in brackets)")
    for col in ("network", "paper", "ours: superneurons", "ours: liveness only"):
        t.add_column(col, justify="right")
    tf = {"AlexNet": 1408, "VGG-16": 80, "Inception-v4": 64, "ResNet-50": 128,
          "ResNet-101": 80, "ResNet-152": 48}
    for name, label, options in networks:
        at = batch_affine(capture_fake(name, 8, **options), 8,
                          capture_fake(name, 16, **options), 16)
        best = largest_batch(at, budget)
        live = _largest_liveness(at, budget)
        t.add_row(label, f"{PAPER_TABLE5[label]} ({tf[label]})", str(best), str(live))
        if name in ("alexnet", "vgg16"):  # check the interpolation against a real capture
            direct = capture_fake(name, best, **options)
            if not same_sizes(direct, at(best)):
                raise AssertionError(f"{label}: interpolated sizes differ from a capture")
    console.print(t)
    console.print("  interpolated graphs equal direct captures at the found batch "
                  "(AlexNet, VGG-16)")


def _largest_liveness(at: Callable[[int], Graph], budget: int, hi: int = 4096) -> int:
    lo = 0
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        peak = _plan(at(mid), recompute="none", offload=False).peak
        lo, hi = (mid, hi) if peak <= budget else (lo, mid)
    return lo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer networks and depths")
    parser.add_argument("--verify-depth", action="store_true",
                        help="capture and plan the predicted deepest ResNet (minutes)")
    args = parser.parse_args(argv)
    console = Console(width=150)
    start = time.perf_counter()
    budget = get_profile(GPU).memory
    alexnet = capture_fake("alexnet", 200)
    fig10(console, alexnet, "AlexNet (200), with LRN as the paper")
    fig10(console, capture_fake("alexnet", 200, lrn=False), "AlexNet (200) without LRN")
    graphs = {"AlexNet (200)": alexnet, "ResNet-50 (32)": capture_fake("resnet50", 32)}
    if not args.quick:
        graphs["ResNet-101 (32)"] = capture_fake("resnet101", 32)
    table1(console, graphs)
    table4(console, [50, 70] if args.quick else [60, 90, 120], budget, args.verify_depth)
    nets = [n for n in TABLE5 if n[0] in ("alexnet", "vgg16", "resnet50")] if args.quick \
        else TABLE5
    table5(console, nets, budget)
    console.print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
