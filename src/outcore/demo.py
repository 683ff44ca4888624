"""``make demo``: train a ResNet on synthetic data on the CPU-emulated accelerator, under a
budget of a third of its in-core peak, with every policy that can meet that budget.

    python -m outcore.demo [--model resnet32-cifar] [--batch 32] [--steps 2] [--out out]

For each policy it prints the predicted and measured peak against the budget, the decisions
(keep / offload / recompute) and the measured step time, and it writes the memory timeline
of outcore-auto's plan (``out/demo_memory.png``) and its stream trace (``out/demo_trace.json``).

Like with like: every policy runs the framework's kernels (a policy's operator variants,
such as vDNN's performance-optimal convolutions, are dropped, as outcore-auto's portfolio
drops them by default and ``benchmarks/planner_table.py`` does), so the simulated times
compare keep / offload / recompute decisions only; a plan that fits only with its variants'
smaller workspaces is shown as not fitting.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
import warnings
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from outcore import progress, zoo
from outcore.api import cost_model_for, plan
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError, VariantWarning
from outcore.graph.bounds import reference_peaks
from outcore.plan.memory import memory_curve
from outcore.planned import PlannedStep
from outcore.policies import names
from outcore.policies.auto import compute_floor
from outcore.runtime.devices import make_device
from outcore.runtime.executor import Executor
from outcore.runtime.link_calibration import first_run_seconds, graph_link
from outcore.units import format_bytes
from outcore.variants.notice import variant_note


def framework_kernels(planned: PlannedStep, budget: int, cost) -> PlannedStep | None:
    """``planned`` with its operator variants dropped (module docstring), re-simulated; None
    when it no longer fits ``budget``."""
    if not planned.schedule.variants:
        return planned
    from outcore.sim import simulate

    schedule = dataclasses.replace(planned.schedule, variants={})
    peak = memory_curve(planned.graph, schedule).peak
    if peak > budget:
        return None
    note = variant_note(planned.graph, planned.schedule.variants)
    return dataclasses.replace(planned, schedule=schedule, predicted_peak=peak,
                               plan=dataclasses.replace(planned.plan, variants={}),
                               simulation=simulate(planned.graph, schedule, cost),
                               notes=[n for n in planned.notes if n != note])


def _train(planned, batch, device, steps: int, model) -> tuple[int, float, float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    executor = Executor(planned.graph, planned.schedule, device)
    peak, seconds, loss = 0, [], 0.0
    for _ in range(steps):
        optimizer.zero_grad()
        start = time.perf_counter()
        result = executor.run(batch)
        seconds.append(time.perf_counter() - start)
        optimizer.step()
        peak = max(peak, result.peak_bytes)
        loss = float(result.loss)
    return peak, min(seconds), loss


def compute_seconds(graph, batch) -> float:
    """This CPU's compute for one in-core step of ``graph`` (the least of two timed steps,
    recomputes none), run without applying its gradients."""
    in_core = plan(graph, None, cache=False, simulate=False)
    device = make_device("cpu-emulated", capacity=None, bandwidth=math.inf)
    try:
        executor = Executor(graph, in_core.schedule, device)
        return min(first_run_seconds(executor.run(batch, apply=False, timed=True).op_seconds)
                   for _ in range(2))
    finally:
        device.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="outcore demo on the CPU-emulated device")
    parser.add_argument("--model", default="resnet32-cifar")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--gpu", default="v100-pcie")
    parser.add_argument("--out", default="out")
    args = parser.parse_args(argv)
    console = Console(width=130)
    progress.configure(True)  # a spinner per step on a terminal; nothing in a pipe
    torch.manual_seed(0)
    work = zoo.get(args.model, args.batch)
    with progress.task(f"capturing {args.model} (batch {args.batch})"):
        graph = capture(work.model, work.loss_fn, work.batch)
    peaks = reference_peaks(graph)
    budget = peaks.liveness // 3
    cost = cost_model_for(args.gpu)
    with progress.task("timing the model's compute on this CPU"):
        link = graph_link(args.gpu, compute_floor(graph, cost),
                          compute_seconds(graph, work.batch))
    console.print(f"[bold]{work.description}[/bold]\n{len(graph.ops)} ops; in-core peak "
                  f"{format_bytes(peaks.liveness)} (free at last use), network-wide "
                  f"{format_bytes(peaks.network_wide)}, layer-wise lower bound "
                  f"{format_bytes(peaks.layer_lower_bound)}.\nBudget: a third of the in-core "
                  f"peak = [bold]{format_bytes(budget)}[/bold] on a CPU-emulated accelerator "
                  f"whose link is {args.gpu}'s scaled to this CPU's speed on this model "
                  f"({link[0] / 1e6:.0f} MB/s). Every policy runs the framework's kernels "
                  "(like with like).\n")
    table = Table(title=f"{args.model}, batch {args.batch}, budget {format_bytes(budget)}")
    for col in ("policy", "fits", "predicted peak", "measured peak", "keep", "offload",
                "recompute", "step s (here)", f"simulated ms ({args.gpu})", "loss"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    auto = None
    simulated: dict[str, float] = {}
    initial = {k: v.clone() for k, v in work.model.state_dict().items()}
    for name in names():
        if name == "keep-all":
            continue
        try:
            with warnings.catch_warnings():  # its variants are dropped just below
                warnings.simplefilter("ignore", VariantWarning)
                planned = plan(graph, budget, policy=name, cost=cost, cache=False)
        except (InfeasibleBudgetError, ValueError) as exc:
            needed = getattr(exc, "required", None)
            table.add_row(name, "[red]no[/red]", format_bytes(needed) if needed else "-", "-",
                          "-", "-", "-", "-", "-", "-")
            continue
        same_kernels = framework_kernels(planned, budget, cost)
        if same_kernels is None:
            table.add_row(name, "[red]no[/red] (only with its own kernels)", "-", "-", "-", "-",
                          "-", "-", "-", "-")
            continue
        planned = same_kernels
        if planned.plan.sub_batches > 1:
            table.add_row(name, "yes", format_bytes(planned.predicted_peak), "sub-batched",
                          *[str(v) for v in planned.counts().values()], "-",
                          f"{planned.simulation.step_time * 1e3:.1f}", "-")
            continue
        work.model.load_state_dict(initial)  # every policy trains from the same weights
        device = make_device("cpu-emulated", capacity=budget, bandwidth=link)
        try:
            with progress.task(f"training {args.steps} steps with {name}"):
                measured, seconds, loss = _train(planned, work.batch, device, args.steps,
                                                 work.model)
        finally:
            device.close()
        counts = planned.counts()
        simulated[name] = planned.simulation.step_time
        table.add_row(name, "yes", format_bytes(planned.predicted_peak), format_bytes(measured),
                      str(counts["keep"]), str(counts["offload"]), str(counts["recompute"]),
                      f"{seconds:.2f}", f"{planned.simulation.step_time * 1e3:.1f}", f"{loss:.4f}")
        if name == "outcore-auto":
            auto = planned
    console.print(table)
    if simulated:
        console.print(_fastest(simulated, args.gpu))
    if auto is not None:
        _write_outputs(auto, Path(args.out), console)
    return 0


#: Simulated steps within this share of each other are a tie (float sums of equal plans).
TIE = 1e-3


def _fastest(simulated: dict[str, float], gpu: str) -> str:
    """The line naming the fastest simulated plan that fits, outcore-auto first on a tie."""
    best = min(simulated.values())
    tied = sorted(k for k, v in simulated.items() if v <= best * (1 + TIE))
    lead = "outcore-auto" if "outcore-auto" in tied else tied[0]
    others = [k for k in tied if k != lead]
    line = f"Fastest simulated plan that fits: [bold]{lead}[/bold] ({best * 1e3:.1f} ms on {gpu})"
    if others:
        line += f", tied within {TIE:.1%} with {', '.join(others)}"
    if "outcore-auto" not in tied:
        auto = simulated.get("outcore-auto")
        line += "; outcore-auto " + (f"{auto * 1e3:.1f} ms" if auto else "did not fit")
    return line + "."


def _write_outputs(planned, out: Path, console: Console) -> None:
    from outcore.report.timeline import plot_memory
    from outcore.report.trace import write_trace

    out.mkdir(parents=True, exist_ok=True)
    png = plot_memory(planned.simulation, out / "demo_memory.png", graph=planned.graph,
                      schedule=planned.schedule, budget=planned.budget)
    write_trace(out / "demo_trace.json", planned.simulation, planned.graph, planned.schedule,
                model=f"{planned.graph.name} (make demo)")
    console.print(f"\nwrote {png} (memory and live tensors per step, outcore-auto) and "
                  f"{out / 'demo_trace.json'} (open in https://ui.perfetto.dev)")


if __name__ == "__main__":
    raise SystemExit(main())
