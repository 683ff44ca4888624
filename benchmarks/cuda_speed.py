"""Real overlap and real speed on a GPU (issue 17, item 3).

For ResNet-50 and a GPT-2-sized transformer (GPT-2 small: 12 layers, d 768, sequence 1024)
at 50% and 30% of the in-core peak, each row is one way of training a step, timed on the
GPU (median of ``--steps`` steps after ``--warmup``, each step ended by a synchronize):

* ``eager in-core``: plain PyTorch, no budget (the baseline every ratio is against);
* ``outcore <policy>``: outcore-auto and each seed policy, planned for the budget and run on
  the CUDA device (its copy streams): the tracked peak (== predicted), the allocator's peak,
  copy-engine busy seconds per direction and the exposed seconds (the compute stream
  standing still in a Wait) from CUDA events, and the simulator's step time for the same
  schedule on ``--profile`` (point 4's error column);
* ``checkpoint per block``: ``torch.utils.checkpoint`` around every repeated block;
* ``torch.compile budget f``: inductor with ``activation_memory_budget = f``, for the
  largest ``f`` among ``--fractions`` whose measured peak fits the budget.

"Peak" is ``torch.cuda.max_memory_allocated`` over the step minus what was allocated before
it, plus the parameters and the batch: the same quantity for every row. The in-core peak
the budgets are fractions of is outcore's liveness peak (the eager step's tracked bytes).

    python benchmarks/cuda_speed.py --models resnet50 gpt2 --json $OUT/speed.json
    python benchmarks/cuda_speed.py --models gpt2 --skip-compile     # faster

Writes a markdown table (for BENCHMARKS.md, the GPU named) to stdout and, with ``--json``,
every row for ``benchmarks/cuda_calibrate.py --speed`` (point 4).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

#: name -> (zoo network, batch, options)
WORKLOADS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "resnet50": ("resnet50", 64, {}),
    "gpt2": ("transformer", 4, {}),
}
FRACTIONS = (0.5, 0.3)
COMPILE_BUDGETS = (1.0, 0.5, 0.3, 0.2, 0.1, 0.0)
SEED_POLICIES = ("outcore-auto", "vdnn-all", "vdnn-conv", "vdnn-dyn", "superneurons", "modnn",
                 "pooch", "dymem", "offload-all", "recompute-cheap")


@dataclass
class Row:
    """One method at one budget; seconds and bytes, None where not applicable."""

    workload: str
    fraction: float
    budget: int
    method: str
    step_s: float | None = None
    peak: int | None = None
    tracked_peak: int | None = None
    d2h_busy_s: float | None = None
    h2d_busy_s: float | None = None
    exposed_s: float | None = None
    simulated_s: float | None = None
    note: str = ""


# -- torch.utils.checkpoint per block -------------------------------------------------------
class Checkpointed(nn.Module):
    """Runs ``block`` under ``torch.utils.checkpoint`` (non-reentrant, RNG preserved)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.block, *args, use_reentrant=False)


def checkpoint_blocks(model: nn.Module) -> int:
    """Wrap every repeated block in ``Checkpointed``; returns how many were wrapped.

    A block is a child of a container whose class is defined outside ``torch.nn`` and
    occurs at least twice among that container's children (ResNet's bottlenecks, a GPT's
    transformer blocks). Wrapped blocks are not searched further.
    """
    wrapped = 0
    for parent in list(model.modules()):
        if isinstance(parent, Checkpointed):
            continue
        children = list(parent.named_children())
        counts: dict[type, int] = {}
        for _, child in children:
            counts[type(child)] = counts.get(type(child), 0) + 1
        for name, child in children:
            kind = type(child)
            if counts[kind] >= 2 and not kind.__module__.startswith("torch.nn"):
                setattr(parent, name, Checkpointed(child))
                wrapped += 1
    return wrapped


# -- picking torch.compile's budget ---------------------------------------------------------
def largest_fitting(fractions: Sequence[float], peak_of: Callable[[float], int | None],
                    budget: int) -> tuple[float | None, int | None]:
    """The largest fraction whose peak fits ``budget`` (tried largest first, stopping at the
    first that fits), and that peak; (None, None) when none fits. ``peak_of`` returns None
    for a fraction that failed to run."""
    for f in sorted(fractions, reverse=True):
        peak = peak_of(f)
        if peak is not None and peak <= budget:
            return f, peak
    return None, None


# -- report ---------------------------------------------------------------------------------
def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.1f}"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def markdown(rows: Sequence[Row], gpu: str) -> str:
    """The BENCHMARKS.md table: per workload and budget, every method against eager."""
    eager = {r.workload: r.step_s for r in rows if r.method == "eager in-core"}
    out = [(f"GPU: {gpu}. Step time median; peak = max_memory_allocated (params + batch + "
           "step); copy busy/exposed from CUDA events; sim = simulated step on the profile."),
           "",
           ("| workload | budget | method | step ms | x eager | peak GiB | fits | tracked GiB "
           "| d2h busy ms | h2d busy ms | exposed ms | sim ms | sim err % | note |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = eager.get(r.workload)
        ratio = f"{r.step_s / base:.2f}" if r.step_s and base else "-"
        fits = "-" if r.peak is None or r.method == "eager in-core" else (
            "yes" if r.peak <= r.budget else "NO")
        err = (f"{(r.simulated_s / r.step_s - 1) * 100:+.1f}"
               if r.simulated_s and r.step_s else "-")
        budget = "in-core" if r.method == "eager in-core" else (
            f"{r.fraction:.0%} ({_gib(r.budget)} GiB)")
        out.append(f"| {r.workload} | {budget} | {r.method} | {_ms(r.step_s)} | {ratio} | "
                   f"{_gib(r.peak)} | {fits} | {_gib(r.tracked_peak)} | {_ms(r.d2h_busy_s)} | "
                   f"{_ms(r.h2d_busy_s)} | {_ms(r.exposed_s)} | {_ms(r.simulated_s)} | {err} | "
                   f"{r.note} |")
    return "\n".join(out)


# -- measuring (GPU) ------------------------------------------------------------------------
def _to_cuda(batch: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(b.cuda() if isinstance(b, torch.Tensor) else b for b in batch)


def timed(step: Callable[[], Any], steps: int, warmup: int,
          model: nn.Module | None = None) -> tuple[float, int]:
    """(median seconds, peak bytes above what was allocated before) of ``step`` on the GPU;
    ``model``'s gradients are dropped first so that "before" holds none (each step makes
    them anew)."""
    for _ in range(warmup):
        step()
    if model is not None:
        for p in model.parameters():
            p.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds), torch.cuda.max_memory_allocated() - before


def _static_bytes(model: nn.Module, batch: Sequence[Any]) -> int:
    tensors = [*model.parameters(), *model.buffers(),
               *(b for b in batch if isinstance(b, torch.Tensor))]
    return sum(t.untyped_storage().nbytes() for t in tensors)


def eager_step(model: nn.Module, loss_fn: Any, batch: Sequence[Any]) -> Callable[[], None]:
    def step() -> None:
        for p in model.parameters():
            p.grad = None
        loss_fn(model(batch[0]), batch[1]).backward()
    return step


def baseline_rows(name: str, work: Any, fraction: float, budget: int, steps: int, warmup: int,
                  compile_budgets: Sequence[float]) -> list[Row]:
    """torch.utils.checkpoint per block and torch.compile with activation_memory_budget."""
    rows = []
    model = copy.deepcopy(work.model).cuda()
    batch = _to_cuda(work.batch)
    static = _static_bytes(model, batch)
    wrapped = checkpoint_blocks(model)
    seconds, peak = timed(eager_step(model, work.loss_fn, batch), steps, warmup, model)
    rows.append(Row(name, fraction, budget, "checkpoint per block", seconds, static + peak,
                    note=f"{wrapped} blocks"))
    if not compile_budgets:
        return rows
    import torch._functorch.config as functorch_config

    results: dict[float, tuple[float, int]] = {}

    def peak_of(f: float) -> int | None:
        torch._dynamo.reset()
        functorch_config.activation_memory_budget = f
        fresh = copy.deepcopy(work.model).cuda()
        compiled = torch.compile(fresh)
        try:
            results[f] = timed(eager_step(compiled, work.loss_fn, batch), steps, warmup,
                               compiled)
        except torch.OutOfMemoryError:
            return None
        return static + results[f][1]

    try:
        f, peak_c = largest_fitting(compile_budgets, peak_of, budget)
    finally:
        functorch_config.activation_memory_budget = 1.0
    if f is None:
        rows.append(Row(name, fraction, budget, "torch.compile", note="no budget in "
                        f"{list(compile_budgets)} fits"))
    else:
        rows.append(Row(name, fraction, budget, f"torch.compile budget {f}", results[f][0],
                        peak_c))
    return rows


def outcore_rows(name: str, work: Any, graph: Any, fraction: float, budget: int,
                 policies: Sequence[str], cost: Any, steps: int, warmup: int) -> list[Row]:
    """Each policy planned for ``budget`` and run on the CUDA device."""
    import outcore
    import outcore.api
    from outcore.runtime.devices.cuda import CudaDevice
    from outcore.runtime.executor import Executor
    from outcore.runtime.subbatch import run_sub_batches, split_batch
    from outcore.sim import simulate

    model = work.model.cuda()
    batch = _to_cuda(work.batch)
    static = _static_bytes(model, batch)

    def recapture(parts: int) -> Any:
        return outcore.capture(model, work.loss_fn, split_batch(batch, parts)[0])

    rows = []
    for policy in policies:
        try:
            planned = outcore.api.plan(graph, budget, policy=policy, cost=cost,
                                       recapture=recapture, simulate=False)
        except (outcore.InfeasibleBudgetError, ValueError) as exc:
            rows.append(Row(name, fraction, budget, f"outcore {policy}",
                            note=f"refused: {str(exc)[:60]}"))
            continue
        sim = simulate(planned.graph, planned.schedule, cost).step_time
        with CudaDevice(capacity=budget) as device:
            device.reserve_host(planned.host_sizes)
            executor = Executor(planned.graph, planned.schedule, device)
            parts = planned.plan.sub_batches
            last: list[Any] = []

            def step(executor: Executor = executor, parts: int = parts,
                     last: list[Any] = last) -> None:
                last.clear()  # the previous step's result holds its gradients
                for p in model.parameters():
                    p.grad = None
                last[:] = [run_sub_batches(executor, batch, parts) if parts > 1
                           else executor.run(batch)]
            for _ in range(warmup):
                step()
            device.synchronize()
            device.reset_stats()
            seconds, peak = timed(step, steps, 0, model)
            stats = device.stats()
        rows.append(Row(name, fraction, budget, f"outcore {planned.plan.policy}", seconds,
                        static + peak, last[0].peak_bytes, stats.d2h.busy_s / steps,
                        stats.h2d.busy_s / steps, stats.exposed_s / steps, sim,
                        note=f"{parts} sub-batches" if parts > 1 else ""))
    return rows


def run_workload(key: str, args: argparse.Namespace, cost: Any) -> list[Row]:
    import outcore
    from outcore import zoo
    from outcore.graph.bounds import reference_peaks

    zoo_name, batch_size, options = WORKLOADS[key]
    work = zoo.get(zoo_name, batch_size, **options)
    model = work.model.cuda()
    batch = _to_cuda(work.batch)
    graph = outcore.capture(model, work.loss_fn, batch)
    in_core = reference_peaks(graph).liveness
    static = _static_bytes(model, batch)
    seconds, peak = timed(eager_step(model, work.loss_fn, batch), args.steps, args.warmup,
                          model)
    rows = [Row(key, 1.0, in_core, "eager in-core", seconds, static + peak, in_core)]
    for fraction in args.budgets:
        budget = int(in_core * fraction)
        rows += outcore_rows(key, work, graph, fraction, budget, args.policies, cost,
                             args.steps, args.warmup)
        rows += baseline_rows(key, work, fraction, budget, args.steps, args.warmup,
                              [] if args.skip_compile else args.fractions)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--budgets", nargs="+", type=float, default=list(FRACTIONS))
    parser.add_argument("--policies", nargs="+", default=list(SEED_POLICIES))
    parser.add_argument("--fractions", nargs="+", type=float, default=list(COMPILE_BUDGETS),
                        help="activation_memory_budget values tried for torch.compile")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile", default="h100",
                        help="hardware profile name, or a profile JSON (cuda_calibrate.py)")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    cost = load_cost(args.profile)
    gpu = torch.cuda.get_device_name()
    rows: list[Row] = []
    for key in args.models:
        rows += run_workload(key, args, cost)
        print(markdown(rows, gpu), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "profile": args.profile,
                       "workloads": {k: WORKLOADS[k] for k in args.models},
                       "rows": [asdict(r) for r in rows]}, f, indent=1)


def load_cost(profile: str) -> Any:
    """An analytic cost model from a profile name or a profiles JSON file (first profile)."""
    from pathlib import Path

    from outcore.cost.model import AnalyticCostModel
    from outcore.cost.profiles import get_profile, load_profiles

    if profile.endswith(".json"):
        found = load_profiles(Path(profile).read_text())
        return AnalyticCostModel(next(iter(found.values())))
    return AnalyticCostModel(get_profile(profile))


if __name__ == "__main__":
    main()
