"""What outcore's simulator predicts for a ``vs_pytorch.py`` workload, without the device.

The workload is built and captured under ``FakeTensorMode`` on this machine (no memory, no
kernels run), planned for a GPU profile at the given budgets (recompute only, or offloads
allowed) and simulated; compare the lines with a ``vs_pytorch.py --device cuda`` run's
measured steps at the same budgets (BENCHMARKS.md, "Session 13: on an H200"). The graph is
this CPU's capture: its attention kernels are the CPU's, not CUDA's.

    PYTHONPATH=src python benchmarks/vs_pytorch_simulated.py --model gpt --size large \\
        --gpu h200 --budgets none 2627.6 2498.5:offload 5081.2 5016.7:offload
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from torch._subclasses.fake_tensor import FakeTensorMode

import outcore

sys.path.insert(0, str(Path(__file__).parent))
from vs_workloads import SIZES, WORKLOADS  # a sibling module of this script

MiB = 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=list(WORKLOADS), default="gpt")
    parser.add_argument("--size", choices=SIZES, default="large")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--budgets", nargs="+", default=["none"],
                        help="MiB, or 'none' (unbounded); ':offload' lets the plan offload")
    args = parser.parse_args(argv)
    with FakeTensorMode(allow_non_fake_inputs=True):
        w = WORKLOADS[args.model](args.size)
        graph = outcore.capture(w.model, w.loss_fn, w.batch, fake=True)
    print(f"{w.about}: {len(graph.ops)} ops, planned for {args.gpu}")
    for spec in args.budgets:
        text, _, how = spec.partition(":")
        budget = None if text == "none" else int(float(text) * MiB)
        planned = outcore.plan(graph, budget, gpu=args.gpu,
                               host_budget=None if how == "offload" else 0)
        sim = planned.simulation
        counts = Counter(d.name.lower() for d in planned.plan.decisions.values())
        print(f"budget {spec}: {planned.plan.policy}, predicted peak "
              f"{planned.predicted_peak / MiB:.1f} MiB, simulated step "
              f"{sim.step_time * 1e3:.1f} ms (compute {sim.compute_time * 1e3:.1f}, exposed "
              f"copies {sim.exposed_transfer_time * 1e3:.1f}), {dict(counts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
