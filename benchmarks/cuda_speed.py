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
On CUDA the plans are made as ``outcore.compile(..., device="cuda")`` makes them: each op's
kernel temporaries measured on the GPU are in the memory rule, and a plan whose caching-
allocator bound is over the budget is made again for less (``within_allocator_rounding``).

``--measured-ops`` plans and simulates with the workload's per-op seconds measured in a
step on the GPU (the link: ``--profile``'s); the ``analytic sim err`` column is the same
schedule simulated on the analytic ``--profile``. Rows are printed (``ROW {json}``) and
the JSON rewritten as each finishes, outcore's rows first and the compiles last, so a run
stopped at its time limit keeps what it measured. ``--device cpu --small`` runs the whole
flow on this CPU (no copy streams): a dry run before a GPU session.

    python benchmarks/cuda_speed.py --models resnet50 gpt2 --json $OUT/speed.json
    python benchmarks/cuda_speed.py --models gpt2 --skip-compile     # faster
    python benchmarks/cuda_speed.py --models gpt2 resnet50 --measured-ops --profile h200 \
        --save-ops $OUT/ops --json $OUT/speed.json                   # session 32's run

Writes a markdown table (for BENCHMARKS.md, the GPU named) to stdout and, with ``--json``,
every row for ``benchmarks/cuda_calibrate.py --speed`` (point 4).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
import traceback
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
    #: the same schedule simulated on the analytic ``--profile`` (with ``--measured-ops``,
    #: ``simulated_s`` is the simulation on the workload's measured per-op profile)
    analytic_s: float | None = None
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
           "| d2h busy ms | h2d busy ms | exposed ms | sim ms | sim err % | analytic sim err % "
            "| note |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = eager.get(r.workload)
        ratio = f"{r.step_s / base:.2f}" if r.step_s and base else "-"
        fits = "-" if r.peak is None or r.method == "eager in-core" else (
            "yes" if r.peak <= r.budget else "NO")
        err = (f"{(r.simulated_s / r.step_s - 1) * 100:+.1f}"
               if r.simulated_s and r.step_s else "-")
        analytic = (f"{(r.analytic_s / r.step_s - 1) * 100:+.1f}"
                    if r.analytic_s and r.step_s else "-")
        budget = "in-core" if r.method == "eager in-core" else (
            f"{r.fraction:.0%} ({_gib(r.budget)} GiB)")
        out.append(f"| {r.workload} | {budget} | {r.method} | {_ms(r.step_s)} | {ratio} | "
                   f"{_gib(r.peak)} | {fits} | {_gib(r.tracked_peak)} | {_ms(r.d2h_busy_s)} | "
                   f"{_ms(r.h2d_busy_s)} | {_ms(r.exposed_s)} | {_ms(r.simulated_s)} | {err} | "
                   f"{analytic} | {r.note} |")
    return "\n".join(out)


# -- measuring (GPU; --device cpu runs the same flow on the CPU, a dry run) -----------------
def _on(device: str, batch: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(b.to(device) if isinstance(b, torch.Tensor) else b for b in batch)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(step: Callable[[], Any], steps: int, warmup: int, model: nn.Module | None = None,
          device: str = "cuda") -> tuple[float, int | None]:
    """(median seconds, peak bytes above what was allocated before) of ``step``; ``model``'s
    gradients are dropped first so that "before" holds none (each step makes them anew). On
    the CPU (a dry run) the peak is None."""
    for _ in range(warmup):
        step()
    if model is not None:
        for p in model.parameters():
            p.grad = None
    _sync(device)
    if device == "cuda":
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        _sync(device)
        seconds.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() - before if device == "cuda" else None
    return statistics.median(seconds), peak


def _static_bytes(model: nn.Module, batch: Sequence[Any]) -> int:
    tensors = [*model.parameters(), *model.buffers(),
               *(b for b in batch if isinstance(b, torch.Tensor))]
    return sum(t.untyped_storage().nbytes() for t in tensors)


def _plus(static: int, peak: int | None) -> int | None:
    return None if peak is None else static + peak


def eager_step(model: nn.Module, loss_fn: Any, batch: Sequence[Any]) -> Callable[[], None]:
    def step() -> None:
        for p in model.parameters():
            p.grad = None
        loss_fn(model(batch[0]), batch[1]).backward()
    return step


@dataclass
class Workload:
    """One workload on the device: the zoo entry, its model and batch there, the graph
    captured there, the in-core peak, the cost models plans are made and simulated with."""

    key: str
    work: Any
    model: nn.Module
    batch: tuple[Any, ...]
    graph: Any
    in_core: int
    cost: Any  # what plans are made and simulated with
    analytic: Any  # the --profile's analytic model
    device: str


def checkpoint_row(w: Workload, fraction: float, budget: int, steps: int,
                   warmup: int) -> Row:
    """torch.utils.checkpoint around every repeated block."""
    model = copy.deepcopy(w.work.model).to(w.device)
    static = _static_bytes(model, w.batch)
    wrapped = checkpoint_blocks(model)
    seconds, peak = timed(eager_step(model, w.work.loss_fn, w.batch), steps, warmup, model,
                          w.device)
    return Row(w.key, fraction, budget, "checkpoint per block", seconds, _plus(static, peak),
               note=f"{wrapped} blocks")


class CompilePeer:
    """torch.compile at each ``activation_memory_budget`` fraction, each compiled and timed at
    most once per workload (the budgets of one workload share the results)."""

    def __init__(self, w: Workload, steps: int, warmup: int) -> None:
        self.w, self.steps, self.warmup = w, steps, warmup
        self.results: dict[float, tuple[float, int] | None] = {}

    def peak_of(self, f: float) -> int | None:
        if f not in self.results:
            import torch._functorch.config as functorch_config

            torch._dynamo.reset()
            functorch_config.activation_memory_budget = f
            try:
                fresh = copy.deepcopy(self.w.work.model).to(self.w.device)
                compiled = torch.compile(fresh)
                seconds, peak = timed(eager_step(compiled, self.w.work.loss_fn, self.w.batch),
                                      self.steps, self.warmup, compiled, self.w.device)
                static = _static_bytes(fresh, self.w.batch)
                self.results[f] = (seconds, static + (peak or 0))
            except torch.OutOfMemoryError:
                self.results[f] = None
            finally:
                functorch_config.activation_memory_budget = 1.0
        got = self.results[f]
        return None if got is None else got[1]

    def row(self, fraction: float, budget: int, fractions: Sequence[float]) -> Row:
        f, peak = largest_fitting(fractions, self.peak_of, budget)
        if f is None:
            return Row(self.w.key, fraction, budget, "torch.compile",
                       note=f"no budget in {list(fractions)} fits")
        got = self.results[f]
        assert got is not None
        return Row(self.w.key, fraction, budget, f"torch.compile budget {f}", got[0], peak)


def _copy_stats(device: Any, steps: int) -> tuple[float | None, float | None, float | None]:
    if not hasattr(device, "stats"):
        return None, None, None
    stats = device.stats()
    return stats.d2h.busy_s / steps, stats.h2d.busy_s / steps, stats.exposed_s / steps


def outcore_row(w: Workload, fraction: float, budget: int, policy: str, steps: int,
                warmup: int) -> Row:
    """``policy`` planned for ``budget`` with ``w.cost`` and run by outcore's executor on the
    device (its copy streams on CUDA); simulated on ``w.cost`` and on the analytic profile."""
    import outcore
    import outcore.api
    from outcore.cost.measured import MeasuredProfile
    from outcore.runtime.executor import Executor
    from outcore.runtime.subbatch import run_sub_batches, split_batch
    from outcore.sim import simulate

    def recapture(parts: int) -> Any:
        return outcore.capture(w.model, w.work.loss_fn, split_batch(w.batch, parts)[0])

    measured = isinstance(w.cost, MeasuredProfile)  # keyed to w.graph: no sub-batch graphs

    def plan_for(target: int) -> Any:
        return outcore.api.plan(w.graph, target, policy=policy, cost=w.cost,
                                recapture=None if measured else recapture, simulate=False)
    try:
        planned = plan_for(budget)
        if w.device == "cuda":  # the caching allocator's blocks within the budget, as compile
            from outcore.plan.allocator_rounding import within_allocator_rounding

            planned = within_allocator_rounding(planned, budget, plan_for)
    except Exception as exc:  # noqa: BLE001 - a refusal or planner failure is a row, not the end
        return Row(w.key, fraction, budget, f"outcore {policy}",
                   note=f"refused: {type(exc).__name__}: {str(exc)[:70]}")
    sim = simulate(planned.graph, planned.schedule, w.cost).step_time
    analytic = sim if not measured else simulate(planned.graph, planned.schedule,
                                                 w.analytic).step_time
    static = _static_bytes(w.model, w.batch)
    if w.device == "cuda":
        from outcore.runtime.devices.cuda import CudaDevice

        device: Any = CudaDevice(capacity=budget)
        device.reserve_host(planned.host_sizes)
    else:
        device = None
    try:
        executor = Executor(planned.graph, planned.schedule, device)
        parts = planned.plan.sub_batches
        last: list[Any] = []

        def step() -> None:
            last.clear()  # the previous step's result holds its gradients
            for p in w.model.parameters():
                p.grad = None
            last[:] = [run_sub_batches(executor, w.batch, parts) if parts > 1
                       else executor.run(w.batch)]
        for _ in range(warmup):
            step()
        _sync(w.device)
        if device is not None:
            device.reset_stats()
        seconds, peak = timed(step, steps, 0, w.model, w.device)
        d2h, h2d, exposed = _copy_stats(device, steps)
    finally:
        if device is not None:
            device.close()
    return Row(w.key, fraction, budget, f"outcore {planned.plan.policy}", seconds,
               _plus(static, peak), last[0].peak_bytes, d2h, h2d, exposed, sim, analytic,
               note=f"{parts} sub-batches" if parts > 1 else "")


def load_workload(key: str, args: argparse.Namespace, analytic: Any) -> tuple[Workload, Row]:
    """The workload on the device, captured there, and its eager in-core row."""
    import outcore
    from outcore import zoo
    from outcore.graph.bounds import reference_peaks

    zoo_name, batch_size, options = WORKLOADS[key]
    options = {**options, **(SMALL.get(key, {}) if args.small else {})}
    work = zoo.get(zoo_name, options.pop("batch", batch_size), **options)
    model = work.model.to(args.device)
    batch = _on(args.device, work.batch)
    graph = outcore.capture(model, work.loss_fn, batch)
    if args.device == "cuda":  # kernel temporaries (cuDNN, cuBLAS workspaces) in every plan
        from outcore.cost.measure_temporaries import measure_temporaries

        measure_temporaries(graph, batch, device="cuda")
    in_core = reference_peaks(graph).liveness
    cost = analytic
    if args.measured_ops:  # per-op seconds in a step on the device, the profile's link
        from bench_device import measured_cost

        cost = measured_cost(graph, batch, analytic.profile, repeats=3)
        if args.save_ops:
            from pathlib import Path

            Path(args.save_ops).mkdir(parents=True, exist_ok=True)
            cost.save(Path(args.save_ops) / f"{key}.ops.json")
    static = _static_bytes(model, batch)
    seconds, peak = timed(eager_step(model, work.loss_fn, batch), args.steps, args.warmup,
                          model, args.device)
    w = Workload(key, work, model, batch, graph, in_core, cost, analytic, args.device)
    return w, Row(key, 1.0, in_core, "eager in-core", seconds, _plus(static, peak), in_core,
                  note=f"{len(graph.ops)} ops, op sum {sum(cost.op_seconds) * 1e3:.1f} ms"
                  if args.measured_ops else f"{len(graph.ops)} ops")


#: ``--small``: sizes for a dry run on the CPU (``--device cpu``)
SMALL: dict[str, dict[str, Any]] = {
    "resnet50": {"batch": 8, "image_size": 64},
    "gpt2": {"batch": 4, "n_layer": 2, "d_model": 128, "n_head": 2, "seq_len": 256},
}


class Report:
    """Rows as they come: each printed at once, and the JSON rewritten after each row (a run
    cut short by its time limit keeps every finished row)."""

    def __init__(self, args: argparse.Namespace, gpu: str) -> None:
        self.args, self.gpu, self.rows = args, gpu, []  # type: list[Row]

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print("ROW", json.dumps(asdict(row)), flush=True)
        if self.args.json:
            partial = self.args.json + ".partial"
            with open(partial, "w") as f:
                json.dump({"gpu": self.gpu, "torch": torch.__version__,
                           "profile": self.args.profile, "measured_ops": self.args.measured_ops,
                           "workloads": {k: WORKLOADS[k] for k in self.args.models},
                           "rows": [asdict(r) for r in self.rows]}, f, indent=1)
            os.replace(partial, self.args.json)  # a run killed mid-write keeps the last file


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
    parser.add_argument("--measured-ops", action="store_true",
                        help="plan and simulate with each workload's per-op times measured in "
                             "a step on the device (the link: --profile's)")
    parser.add_argument("--save-ops", help="with --measured-ops: write each workload's "
                        "measured profile here (<workload>.ops.json)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a dry run of the whole flow on this CPU (no copy streams)")
    parser.add_argument("--small", action="store_true", help="small sizes (a dry run)")
    parser.add_argument("--json", help="write every row here (rewritten after each row)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu "
                     "runs the flow on this CPU")
    analytic = load_cost(args.profile)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "this CPU (dry run)"
    report = Report(args, gpu)
    loaded = []
    for key in args.models:  # outcore and checkpoint rows first, the compiles last
        w, eager = load_workload(key, args, analytic)
        report.add(eager)
        for fraction in args.budgets:
            budget = int(w.in_core * fraction)
            for policy in args.policies:
                try:
                    row = outcore_row(w, fraction, budget, policy, args.steps, args.warmup)
                except Exception as exc:  # noqa: BLE001 - a failed run is reported, the rest go on
                    traceback.print_exc()
                    row = Row(key, fraction, budget, f"outcore {policy}",
                              note=f"FAILED: {type(exc).__name__}: {str(exc)[:70]}")
                report.add(row)
            report.add(checkpoint_row(w, fraction, budget, args.steps, args.warmup))
        print(markdown(report.rows, gpu), flush=True)
        loaded.append(w)
    if not args.skip_compile:
        for w in loaded:
            peer = CompilePeer(w, args.steps, args.warmup)
            for fraction in args.budgets:
                report.add(peer.row(fraction, int(w.in_core * fraction), args.fractions))
        print(markdown(report.rows, gpu), flush=True)


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
