"""Pool size under each placement policy vs the live-bytes lower bound (issue #5, item 4).

For each network (captured under FakeTensorMode: sizes only, no memory) and each plan
(``liveness``: keep everything, free at last use; ``offload-all``: Dymem/vDNN-style swapping
of every activation backward reads), the step's block lifetimes are derived with
``blocks_from_schedule`` and placed by every pool policy. Columns: pool size, lower bound
(peak of live bytes, unrounded), their ratio, Dymem's mean U_f over the allocations, and the
GTBM squeeze details. Dymem (HPDC'20 §5.4, Fig. 15) reports for ResNet-32 (CIFAR, no batch
norm, batch 100) about 2500 MB with best fit vs 1854 MB with GTBM (ratio 1.35).

Needs: outcore.zoo.get(name, batch_size, fake=True), outcore.capture.capture(model, loss_fn,
batch, fake=True), outcore.policies.baseline.{liveness, offload_all},
outcore.plan.lower.lower(graph, plan).

Run:  .venv/bin/python benchmarks/pool_table.py [--networks resnet32-cifar vgg16]
      [--plans liveness offload-all] [--beta-mb 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from outcore.pool import POLICIES, Block, blocks_from_schedule, place

MB = 1e6  # Dymem reports MB; decimal megabytes here


@dataclass(frozen=True)
class Network:
    """A zoo network at the batch size the papers use."""

    zoo_name: str
    batch: int
    label: str
    options: dict[str, Any] = field(default_factory=dict)


NETWORKS = {
    # Dymem §5.4: ResNet-32 on CIFAR-10 without batch norm, batch 100
    "resnet32-cifar": Network("resnet32-cifar", 100, "ResNet-32 b100", {"batchnorm": False}),
    # Dymem Fig. 12: Inception V4 at batch 128
    "inception-v4": Network("inception-v4", 128, "Inception-v4 b128"),
    # not in Dymem; ImageNet size, a batch that fits one 16 GB GPU without swapping
    "densenet121": Network("densenet121", 32, "DenseNet-121 b32"),
    # Dymem §4.3.1: VGG-16 at batch 64 (and 128)
    "vgg16": Network("vgg16", 64, "VGG-16 b64"),
}
PLANS = {"liveness": "liveness", "offload-all": "offload_all"}


def network_blocks(net: Network, plan_name: str) -> list[Block]:
    """Capture ``net`` (fake), lower ``plan_name`` and return its block lifetimes."""
    from outcore import zoo
    from outcore.capture import capture
    from outcore.plan.lower import lower
    from outcore.policies import baseline

    workload = zoo.get(net.zoo_name, net.batch, fake=True, **net.options)
    graph = capture(workload.model, workload.loss_fn, workload.batch, fake=True)
    plan = getattr(baseline, PLANS[plan_name])(graph)
    return blocks_from_schedule(graph, lower(graph, plan))


def _note(policy: str, info: dict[str, Any]) -> str:
    if policy == "gtbm":
        return (f"main {info['main'] / MB:.0f} + incr {info['incremental'] / MB:.0f} MB; "
                f"{info['runs']} runs")
    if policy == "planned":
        return f"method {info['method']}"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--plans", nargs="+", default=list(PLANS), choices=list(PLANS))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--beta-mb", type=float, default=0.0,
                        help="Dymem's beta for the GTBM squeeze, in MB (0: bisect)")
    args = parser.parse_args()
    console = Console(width=150)
    table = Table(title="Pool size per placement policy vs the live-bytes lower bound")
    for col, just in [("network", "left"), ("plan", "left"), ("policy", "left"),
                      ("pool MB", "right"), ("bound MB", "right"), ("ratio", "right"),
                      ("mean U_f", "right"), ("blocks", "right"), ("s", "right"),
                      ("notes", "left")]:
        table.add_column(col, justify=just)
    for key in args.networks:
        net = NETWORKS[key]
        for plan_name in args.plans:
            started = time.perf_counter()
            blocks = network_blocks(net, plan_name)
            console.log(f"{net.label} / {plan_name}: {len(blocks)} blocks captured in "
                        f"{time.perf_counter() - started:.1f} s")
            for policy in args.policies:
                options = {"beta": int(args.beta_mb * MB)} if policy == "gtbm" else {}
                started = time.perf_counter()
                placed = place(blocks, policy, **options)
                table.add_row(net.label, plan_name, policy, f"{placed.pool_size / MB:,.1f}",
                              f"{placed.lower_bound / MB:,.1f}", f"{placed.ratio:.3f}",
                              f"{placed.mean_uf:.3f}", str(len(blocks)),
                              f"{time.perf_counter() - started:.2f}",
                              _note(policy, placed.info))
            table.add_section()
    table.add_row("ResNet-32 b100 (paper)", "Dymem", "best-fit", "~2500", "", "", "", "", "",
                  "Dymem Fig. 15 (vDNN's CNMeM best fit)")
    table.add_row("ResNet-32 b100 (paper)", "Dymem", "gtbm", "1854", "", "", "", "", "",
                  "Dymem Fig. 15; best fit / GTBM = 1.35")
    console.print(table)
    console.print(
        "Bound: peak of live bytes (unrounded). Pools round to 512 B (1 KB for the heap). "
        "GTBM: blocks grouped by Dymem's Alg. 3, main space squeezed to the smallest size that "
        "works (beta 0: bisection over re-runs; its best case). Dymem's MB are its runtime's "
        "own allocation sequence and include convolution workspace grown into free pool memory "
        "(its §4.2); ours are the step's tensors in the order outcore's lowering allocates "
        "them, without workspace.")
    console.print("Re-run: .venv/bin/python benchmarks/pool_table.py "
                  + " ".join(["--networks", *args.networks, "--plans", *args.plans,
                              "--policies", *args.policies, "--beta-mb", str(args.beta_mb)]),
                  soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
