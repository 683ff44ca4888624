"""How long ``simulate`` takes on SuperNeurons' 10^4-layer ResNet (2500 residual units).

Run: ``.venv/bin/python benchmarks/sim_speed.py [units]`` (default 2500).

The graph is built in plain Python (``outcore.sim.synthetic.residual_chain``: per unit
conv -> relu -> norm -> add, and the mirror-image backward, so 10,000 forward ops for 2500
units) and two schedules are timed: keep-all (free at last use) and offload-all (every
saved activation offloaded and prefetched 2 ops ahead). Target: under 5 s per simulation on
this machine, including the plan verifier and the memory curve. The time per instruction is
printed so runs on different machines can be compared.
"""

from __future__ import annotations

import sys
import time

from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.plan.memory import memory_curve
from outcore.sim import simulate
from outcore.sim.synthetic import keep_all_schedule, offload_all_schedule, residual_chain

TARGET_S = 5.0


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def main(units: int) -> int:
    graph, build_s = timed(residual_chain, units)
    print(f"# simulate() speed: residual chain of {units} units, {len(graph.ops)} ops "
          f"({sum(op.phase.value == 'forward' for op in graph.ops)} forward), "
          f"{len(graph.tensors)} tensors; built in {build_s:.2f} s\n")
    model = AnalyticCostModel(get_profile("k40c"))  # SuperNeurons ran ResNet-2500 on a K40c
    print("| schedule     | instructions | simulate | no verify | memory_curve | us/instr | "
          "step (K40c) | peak      | exposed |")
    print("|--------------|--------------|----------|-----------|--------------|----------|"
          "-------------|-----------|---------|")
    worst = 0.0
    for label, make in (("keep-all", keep_all_schedule), ("offload-all", offload_all_schedule)):
        schedule = make(graph)
        result, sim_s = timed(simulate, graph, schedule, model)
        _, bare_s = timed(simulate, graph, schedule, model, verify=False)
        _, curve_s = timed(memory_curve, graph, schedule)
        worst = max(worst, sim_s)
        print(f"| {label:<12} | {len(schedule):>12,} | {sim_s:6.2f} s | {bare_s:7.2f} s | "
              f"{curve_s:10.2f} s | {1e6 * sim_s / len(schedule):8.1f} | "
              f"{result.step_time:9.2f} s | {result.peak_bytes / 2**30:6.2f} GiB | "
              f"{100 * result.exposed_transfer_time / result.step_time:5.1f} % |")
    verdict = "OK" if worst < TARGET_S else "TOO SLOW"
    print(f"\nslowest simulate: {worst:.2f} s (target < {TARGET_S:.0f} s): {verdict}")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2500))
