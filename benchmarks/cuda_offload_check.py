"""Why an offloading plan is slower on the GPU than the simulator says (a diagnosis, on CUDA).

For a ``vs_pytorch.py`` workload on the GPU, at each budget: the plan made with the
workload's measured per-op profile (``bench_device.Target.measured_cost``), copies allowed;
what the simulator predicts (step, compute, exposed copies, bytes each way); the executor's
measured step (median of ``--steps``); and one step under ``torch.profiler`` (CUDA
activity): the GPU time of the copies each way and of the kernels, so a slow link (copies
longer than priced) can be told from poor overlap (copies as priced, but exposed). The
link is measured first (pinned buffers, both directions at once: ``cuda_calibrate``) and
printed beside the catalogue profile's; the plans price copies at the catalogue's link.

    PYTHONPATH=src python benchmarks/cuda_offload_check.py --budgets 2498.5 5016.7
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

import outcore
from outcore.cost.measure_temporaries import measure_temporaries
from outcore.cost.profiles import get_profile
from outcore.runtime.executor import Executor

sys.path.insert(0, str(Path(__file__).parent))
from bench_device import Target  # sibling modules of this script
from vs_workloads import WORKLOADS

from cuda_calibrate import fit_link, measure_link

MiB = 2**20


def _profiled(step) -> dict[str, float]:
    """GPU seconds of one ``step``: copies device->host, host->device, everything else."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    out = {"d2h": 0.0, "h2d": 0.0, "kernels": 0.0}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0)) / 1e6
        if "DtoH" in e.key:
            out["d2h"] += t
        elif "HtoD" in e.key:
            out["h2d"] += t
        elif e.key.startswith("Memcpy") or e.key.startswith("Memset"):
            continue
        elif getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            out["kernels"] += t
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=12), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=list(WORKLOADS), default="gpt")
    parser.add_argument("--budgets", nargs="+", type=float, default=[2498.5])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--size", default="large", help="vs_workloads size (quick: a dry run)")
    args = parser.parse_args(argv)
    target = Target.of("cuda")
    link = fit_link(measure_link([64 << 20, 256 << 20], 3))
    for key, fit in sorted(link.items()):
        print(f"link {key}: {fit.bandwidth / 1e9:.2f} GB/s, latency {fit.latency_s * 1e6:.1f} us")
    profile = get_profile(target.gpu)
    print(f"profile {target.gpu}: h2d {profile.h2d_bandwidth / 1e9:.2f}, d2h "
          f"{profile.d2h_bandwidth / 1e9:.2f} GB/s, {profile.copy_engines} copy engines")
    w = WORKLOADS[args.model](args.size)
    w.model, w.batch = target.move(w.model, w.batch)
    graph = outcore.capture(w.model, w.loss_fn, w.batch)
    measure_temporaries(graph, w.batch, device="cuda")
    cost = target.measured_cost(graph, w.batch)
    print(f"{w.about}: {len(graph.ops)} ops, measured op sum {sum(cost.op_seconds) * 1e3:.1f} ms")
    for budget_mib in args.budgets:
        planned = outcore.plan(graph, int(budget_mib * MiB), gpu=target.gpu, cost=cost,
                               host_budget=None, cache=False)
        sim = planned.simulation
        copies = {"offload": 0, "prefetch": 0}
        for ins in planned.schedule.instructions:
            kind = type(ins).__name__.lower()
            if kind in copies:
                copies[kind] += planned.graph.storage_bytes(ins.tensor)
        print(f"\nbudget {budget_mib} MiB: {planned.plan.policy}, simulated step "
              f"{sim.step_time * 1e3:.1f} ms (compute {sim.compute_time * 1e3:.1f}, exposed "
              f"copies {sim.exposed_transfer_time * 1e3:.1f}, stall {sim.stall_time * 1e3:.1f}); "
              f"offload {copies['offload'] / MiB:.0f} MiB, prefetch {copies['prefetch'] / MiB:.0f} "
              f"MiB", flush=True)
        device = target.executor_device()
        if device is not None:
            device.reserve_host(planned.host_sizes)
        ex = Executor(planned.graph, planned.schedule, device)

        def step(ex: Executor = ex) -> object:
            return ex.run(w.batch).loss

        step()
        times = [target.timed(step) for _ in range(args.steps)]
        print(f"  measured step {statistics.median(times) * 1e3:.1f} ms "
              f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})", flush=True)
        gpu = _profiled(step)
        print(f"  profiled GPU time: kernels {gpu['kernels'] * 1e3:.1f} ms, d2h "
              f"{gpu['d2h'] * 1e3:.1f} ms ({copies['offload'] / max(gpu['d2h'], 1e-9) / 1e9:.1f} "
              f"GB/s), h2d {gpu['h2d'] * 1e3:.1f} ms "
              f"({copies['prefetch'] / max(gpu['h2d'], 1e-9) / 1e9:.1f} GB/s)", flush=True)
        del ex
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
