"""Data parallel: moDNN's two-GPU result (Fig. 9) simulated, a 1/2/4/8-GPU scaling table on
a PCIe and an NVLink host, and emulated 2- and 4-rank runs for memory and gradients.

Run: ``PYTHONPATH=src python benchmarks/data_parallel.py`` (a few minutes on 2 cores;
``--quick``: VGG-16 only and 2 emulated ranks; ``--check``: also every policy on the zoo's
ResNet, DenseNet-style and transformer with 2 and 4 ranks, and SyncBatchNorm against
BatchNorm on the whole batch, what the slow tests assert; ``--sync-bn N``: only that table
on N ranks).

* **Fig. 9** (moDNN §V.C, two K40m on one PCIe bus, ``k40m-x2``): VGG-16 and VGG-19 at
  batch 256; moDNN on one GPU at a budget against moDNN on two GPUs (128 each) at the same
  budget per GPU, both priced like ``repro_modnn.py`` (cuDNN-era convolution algorithms on
  the ``k40c`` profile); two GPUs share the bus (5 GB/s each instead of 8 when both copy)
  and all-reduce their 528-548 MB of gradients over PCIe through the root complex
  (``pcie3-root``, 6 GB/s), overlapped with backward when moDNN runs one pass. The "ideal"
  single GPU is moDNN's: the sum of every task's time, no transfers.
* **Scaling**: VGG-16 (256) at 12 GiB and ResNet-50 (256) at 6 GiB per GPU, ``outcore-auto``
  on V100s, 1/2/4/8 GPUs, on ``v100-pcie-x8`` (4 GPUs per x16 uplink, all-reduce over PCIe)
  and ``dgx1-v100`` (2 GPUs per uplink, NVLink 2 all-reduce). Strong scaling: the global
  batch stays 256.
* **Emulated**: the same step on 2 (and 4) CPU processes with gloo, each rank on its own
  CPU-emulated device: predicted vs measured peak per rank (gradient buckets included) and
  the averaged gradients against the single-process ones.

docs/repro/modnn.md writes up the differences from the paper.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "distributed"))

from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.cost.interconnects import get_host
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.distributed.compile import plan_rank
from outcore.errors import InfeasibleBudgetError
from outcore.policies.modnn import ConvAlgorithmCost
from outcore.reproduce.modnn import Net, cudnn_time, ideal_time
from outcore.sim.multi_gpu import rank_profile, simulate_data_parallel

GiB = 2**30
CAP = 25 << 20  # bucket bytes (DDP's default)
PAPER_FIG9 = {"over moDNN on one GPU": 1.84, "over the ideal single GPU": 1.5}


# ---- Fig. 9 ----------------------------------------------------------------------------------
def modnn_step(net: Net, gpus: int, budget: int) -> tuple[Any, str]:
    """moDNN on one rank of ``gpus`` (``net`` captured at the rank's share), simulated."""
    host = get_host("k40m-x2")
    profile = rank_profile(get_profile(host.gpu), host, gpus)
    cost = ConvAlgorithmCost(AnalyticCostModel(profile), relative_time=cudnn_time)
    try:
        planned, _ = plan_rank(net.at(1), budget, "modnn", cost, net.at, CAP, gpus, {})
    except InfeasibleBudgetError as exc:
        return None, f"needs {exc.required / GiB:.2f} GiB"
    return simulate_data_parallel(planned.graph, planned.schedule, cost, host, gpus), ""


def fig9(budgets: list[float]) -> Table:
    t = Table(title="Fig. 9: moDNN on two K40m sharing one PCIe bus (k40m-x2), batch 256 "
                    f"(paper: {PAPER_FIG9['over moDNN on one GPU']}x over one GPU at the same "
                    f"budget, {PAPER_FIG9['over the ideal single GPU']}x over the ideal one)")
    for col in ("network", "budget/GPU", "ideal 1 GPU (s)", "moDNN 1 GPU (s, k)",
                "moDNN 2 GPUs (s, k/rank)", "rank step", "all-reduce", "exposed",
                "x over 1 GPU", "x over ideal"):
        t.add_column(col, justify="left" if col == "network" else "right")
    paper_cost = ConvAlgorithmCost(AnalyticCostModel(get_profile("k40c")),
                                   relative_time=cudnn_time)
    over_one, over_ideal = [], []
    for name, label in (("vgg16", "VGG-16"), ("vgg19", "VGG-19")):
        one_net, two_net = Net(name, 256, label, {}), Net(name, 128, label, {})
        ideal = ideal_time(one_net.at(1), paper_cost)
        for budget in budgets:
            limit = int(budget * GiB)
            one, why1 = modnn_step(one_net, 1, limit)
            two, why2 = modnn_step(two_net, 2, limit)
            if one is None or two is None:
                t.add_row(label, f"{budget:g} GiB", f"{ideal:.2f}", why1 or "", why2 or "",
                          *[""] * 5)
                continue
            a, b = one.step_time / two.step_time, ideal / two.step_time
            over_one.append(a)
            over_ideal.append(b)
            t.add_row(label, f"{budget:g} GiB", f"{ideal:.2f}",
                      f"{one.step_time:.2f} ({one.rank.sub_batches})",
                      f"{two.step_time:.2f} ({two.rank.sub_batches})",
                      f"{two.rank.step_time:.2f}", f"{two.comm_time:.3f}",
                      f"{two.exposed_comm_time:.3f}", f"{a:.2f}", f"{b:.2f}")
    if over_one:
        t.add_row("mean", "", "", "", "", "", "", "",
                  f"{sum(over_one) / len(over_one):.2f}",
                  f"{sum(over_ideal) / len(over_ideal):.2f}")
    return t


# ---- scaling ---------------------------------------------------------------------------------
def scaling(name: str, label: str, batch: int, budget: float, gpus: list[int]) -> Table:
    t = Table(title=f"Scaling: {label} (global batch {batch}), outcore-auto at {budget:g} GiB "
                    "per V100, strong scaling")
    for col in ("host", "GPUs", "batch/GPU", "host link/GPU GB/s", "rank step ms",
                "exposed copies ms", "all-reduce ms", "exposed all-reduce ms", "step ms",
                "speed-up", "efficiency"):
        t.add_column(col, justify="left" if col == "host" else "right")
    graphs: dict[int, Any] = {}
    base = cost_model_for("v100-pcie")
    for host_name in ("v100-pcie-x8", "dgx1-v100"):
        host = get_host(host_name)
        single = None
        for n in gpus:
            if n not in graphs:
                w = zoo.get(name, batch // n, fake=True)
                graphs[n] = capture(w.model, w.loss_fn, w.batch, fake=True)
            cost = AnalyticCostModel(rank_profile(base.profile, host, n), variants=base.variants)
            try:
                planned, _ = plan_rank(graphs[n], int(budget * GiB), "outcore-auto", cost, None,
                                       CAP, n, {})
            except InfeasibleBudgetError as exc:
                t.add_row(host_name, str(n), str(batch // n),
                          f"needs {exc.required / GiB:.1f} GiB", *[""] * 7)
                continue
            r = simulate_data_parallel(planned.graph, planned.schedule, cost, host, n)
            if n == 1:
                single = r.step_time
            speedup = "-" if single is None else f"{single / r.step_time:.2f}"
            eff = "-" if single is None else f"{single / r.step_time / n:.0%}"
            t.add_row(host_name, str(n), str(batch // n), f"{r.copy_bandwidth[0] / 1e9:.1f}",
                      f"{r.rank.step_time * 1e3:.0f}",
                      f"{r.rank.exposed_transfer_time * 1e3:.0f}",
                      f"{r.comm_time * 1e3:.0f}", f"{r.exposed_comm_time * 1e3:.0f}",
                      f"{r.step_time * 1e3:.0f}", speedup, eff)
    return t


def link_sharing(name: str, label: str, batch: int, budget: float, gpus: list[int]) -> Table:
    """Weak scaling at a budget that forces offloads: the shared host link slows the copies
    as ranks are added; a plan made for the unshared link against one made knowing it."""
    t = Table(title=f"Shared host link: {label}, batch {batch} per GPU, outcore-auto at "
                    f"{budget:g} GiB per V100 (weak scaling)")
    for col in ("host", "GPUs", "host link/GPU GB/s", "moved/GPU GiB",
                "planned for 12 GB/s: step ms (exposed copies)",
                "planned for the shared link: step ms (exposed copies)"):
        t.add_column(col, justify="left" if col == "host" else "right")
    w = zoo.get(name, batch, fake=True)
    graph = capture(w.model, w.loss_fn, w.batch, fake=True)
    base = cost_model_for("v100-pcie")
    for host_name in ("v100-pcie-x8", "dgx1-v100"):
        host = get_host(host_name)
        for n in gpus:
            shared = AnalyticCostModel(rank_profile(base.profile, host, n),
                                       variants=base.variants)
            cells = []
            for planning in (base, shared):
                planned, _ = plan_rank(graph, int(budget * GiB), "outcore-auto", planning, None,
                                       CAP, n, {})
                r = simulate_data_parallel(planned.graph, planned.schedule, shared, host, n)
                shown = f"{r.step_time * 1e3:.0f} ({r.rank.exposed_transfer_time * 1e3:.0f})"
                cells.append((r, shown))
            moved = cells[1][0].rank.bytes_d2h / GiB
            t.add_row(host_name, str(n), f"{cells[1][0].copy_bandwidth[0] / 1e9:.1f}",
                      f"{moved:.1f}", cells[0][1], cells[1][1])
    return t


# ---- emulated ranks --------------------------------------------------------------------------
def emulated(cases: list[tuple[str, int, list[str]]], world: int, title: str) -> Table:
    import dp_workers

    t = Table(title=title)
    for col in ("network", "policy", "ranks", "budget", "predicted peak/rank",
                "measured peak/rank", "buckets", "k", "moved", "err vs same plan",
                "err vs DDP (eager)", "err vs whole batch"):
        t.add_column(col, justify="left" if col in ("network", "policy") else "right")

    results = dp_workers.launch(_run_cases, world, cases, deadline=1800)
    for rank, result in enumerate(results):
        if isinstance(result, tuple):
            raise RuntimeError(f"rank {rank} failed: {result[2]}")
    for name, rows in results[0].items():
        for policy, r in rows.items():
            if "error" in r:
                t.add_row(name, policy, str(world), "", r["error"][:60], *[""] * 7)
                continue
            budget = "-" if r["budget"] is None else f"{r['budget'] / 1024:.0f} KiB"
            t.add_row(name, policy, str(world), budget, f"{r['predicted'] / 1024:.1f} KiB",
                      f"{r['measured'] / 1024:.1f} KiB", str(r["buckets"]),
                      str(r["sub_batches"]), str(r["moved"]), f"{r['plan']:.1e}",
                      f"{r['ddp']:.1e}" + ("" if r["variants"] == 0 else " (variants)"),
                      f"{r['whole']:.1e}")
    return t


def sync_bn(name: str, batch: int, world: int) -> Table:
    """``nn.SyncBatchNorm`` on ``world`` emulated ranks against BatchNorm on the whole batch
    in one process, every policy (``tests/distributed/test_sync_batchnorm.py``)."""
    import dp_workers
    import sync_bn_workers

    t = Table(title=f"SyncBatchNorm on {world} emulated ranks vs BatchNorm on the whole "
                    f"batch: small {name}, batch {batch}, every policy")
    for col in ("policy", "budget", "predicted peak/rank", "measured peak/rank", "moved",
                "all-reduces issued", "of which replayed (not issued)", "err grads",
                "err running stats"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    results = dp_workers.launch(sync_bn_workers.sync_bn_vs_whole_batch, world, name, batch,
                                ["*"], deadline=3600)
    for rank, result in enumerate(results):
        if isinstance(result, tuple):
            raise RuntimeError(f"rank {rank} failed: {result[2]}")
    for policy, r in results[0].items():
        if "error" in r:
            t.add_row(policy, r["error"][:60], *[""] * 7)
            continue
        budget = "-" if r["budget"] is None else f"{r['budget'] / 1024:.0f} KiB"
        t.add_row(policy, budget, f"{r['predicted'] / 1024:.1f} KiB",
                  f"{r['measured'] / 1024:.1f} KiB", str(r["moved"]), str(r["issued"]),
                  str(r["recomputed_collectives"]), f"{r['grads']:.1e}", f"{r['buffers']:.1e}")
    return t


def _run_cases(rank: int, world: int, cases: list[tuple[str, int, list[str]]]) -> Any:
    import dp_workers

    return {n: dp_workers.grads_vs_reference(rank, world, n, b, p, 0.5) for n, b, p in cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="VGG-16 only, 2 emulated ranks")
    parser.add_argument("--check", action="store_true",
                        help="also every policy on ResNet/DenseNet/transformer, 2 and 4 ranks")
    parser.add_argument("--sync-bn", type=int, default=0, metavar="RANKS",
                        help="only the SyncBatchNorm table on RANKS emulated ranks")
    args = parser.parse_args(argv)
    console = Console(width=180)
    start = time.perf_counter()
    if args.sync_bn:
        console.print(sync_bn("resnet18", 8, args.sync_bn))
        console.print(f"done in {time.perf_counter() - start:.0f} s")
        return 0
    console.print(fig9([12] if args.quick else [12, 6, 3]))
    console.print(emulated([("vgg16", 8, ["modnn", "keep-all"])], 2,
                           "moDNN's step emulated on 2 CPU ranks (gloo): small VGG-16, batch 8"))
    console.print(scaling("vgg16", "VGG-16", 256, 12, [1, 2, 4, 8]))
    console.print(link_sharing("vgg16", "VGG-16", 64, 4.5, [1, 2, 4, 8]))
    if not args.quick:
        console.print(scaling("resnet50", "ResNet-50", 256, 6, [1, 2, 4, 8]))
    if args.check:
        cases = [("resnet18", 16, ["*"]), ("densenet121", 8, ["*"]), ("transformer", 8, ["*"])]
        for world in (2, 4):
            console.print(emulated(cases, world, f"Every policy on {world} emulated ranks"))
            console.print(sync_bn("resnet18", 8, world))
    console.print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
