"""The ``outcore`` subcommands (argument parsing lives in ``outcore.cli``).

Each ``cmd_*`` returns a JSON-able dict (printed with --json) and renders rich tables
otherwise. Errors are raised, and ``outcore.cli.main`` maps them to exit codes.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from outcore.cli import UsageError, emit
from outcore.units import format_bytes, parse_bytes


def load_workload(args: argparse.Namespace, *, fake: bool) -> tuple[Any, Any, Any, str]:
    """(model, loss_fn, batch, label) from ``--model`` (zoo name or module:function)."""
    spec = args.model
    if ":" in spec:
        module_name, _, func_name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"cannot load {spec!r}: {exc}") from None
        made = fn()
        if hasattr(made, "model"):
            return made.model, made.loss_fn, made.batch, spec
        if not (isinstance(made, tuple) and len(made) == 3):
            raise UsageError(f"{spec} must return (model, loss_fn, (x, y)) or a zoo Workload")
        return made[0], made[1], made[2], spec
    from outcore import zoo

    if spec not in zoo.names():
        raise UsageError(f"unknown model {spec!r}; zoo models: {', '.join(zoo.names())}, "
                         "or give module:function")
    if args.batch < 1:
        raise UsageError("--batch must be at least 1")
    w = zoo.get(spec, args.batch, fake=fake, small=getattr(args, "small", False))
    return w.model, w.loss_fn, w.batch, f"{spec} (batch {args.batch})"


def _budget(args: argparse.Namespace) -> int | None:
    if args.budget is None:
        return None
    try:
        return parse_bytes(args.budget)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _capture(args: argparse.Namespace, *, fake: bool) -> tuple[Any, str]:
    from outcore.capture import capture

    model, loss_fn, batch, label = load_workload(args, fake=fake)
    return capture(model, loss_fn, batch, fake=fake), label


def _planned(args: argparse.Namespace):
    from outcore.api import plan

    graph, label = _capture(args, fake=not getattr(args, "real", False))
    return plan(graph, _budget(args), policy=args.policy, gpu=args.gpu), label


def _summary(planned: Any, label: str) -> dict[str, Any]:
    sim = planned.simulation
    return {
        "model": label, "policy": planned.plan.policy, "budget": planned.budget,
        "predicted_peak": planned.predicted_peak, "decisions": planned.counts(),
        "sub_batches": planned.plan.sub_batches,
        "instructions": len(planned.schedule),
        "simulation": sim.to_dict() if sim is not None else None,
        "lower_bound": planned.lower_bound, "gap": planned.gap,
    }


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    planned, label = _planned(args)
    result = _summary(planned, label)

    def render(console: Any) -> None:
        from rich.table import Table

        table = Table(title=f"outcore plan: {label}, policy {planned.plan.policy}")
        table.add_column("quantity")
        table.add_column("value", justify="right")
        budget = "unbounded" if planned.budget is None else format_bytes(planned.budget)
        table.add_row("budget", budget)
        table.add_row("predicted peak", format_bytes(planned.predicted_peak))
        for decision, count in planned.counts().items():
            table.add_row(f"activations {decision}", str(count))
        table.add_row("sub-batches", str(planned.plan.sub_batches))
        if planned.simulation is not None:
            sim = planned.simulation
            table.add_row(f"simulated step ({sim.cost_model})", f"{sim.step_time * 1e3:.2f} ms")
            table.add_row("exposed transfer", f"{sim.exposed_transfer_time * 1e3:.2f} ms")
        if planned.gap is not None:
            table.add_row("lower bound (any plan)", f"{planned.lower_bound * 1e3:.2f} ms")
            table.add_row("gap to the bound", f"{planned.gap * 100:.1f}%")
        console.print(table)

    emit(args, render)
    return result


def cmd_simulate(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.report.timeline import plot_memory
    from outcore.report.trace import write_trace

    planned, label = _planned(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_memory(planned.simulation, out / "memory.png", graph=planned.graph)
    trace = out / "trace.json"
    write_trace(trace, planned.simulation, planned.graph, planned.schedule)
    from outcore.report.html import write_html

    report = write_html(planned, out / "report.html", title=f"outcore plan: {label}")
    result = _summary(planned, label) | {"plot": str(png), "trace": str(trace),
                                         "report": str(report)}
    emit(args, lambda console: console.print(
        f"[bold]{label}[/bold], policy {planned.plan.policy}\n{planned.simulation.summary()}\n"
        f"wrote {png}, {trace} and {report}"))
    return result


def cmd_compare(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.api import plan
    from outcore.errors import InfeasibleBudgetError
    from outcore.policies import names

    graph, label = _capture(args, fake=not getattr(args, "real", False))
    budget = _budget(args)
    rows = []
    for name in names():
        try:
            p = plan(graph, budget, policy=name, gpu=args.gpu)
            rows.append({"policy": name, "feasible": True, "peak": p.predicted_peak,
                         "step_time": p.simulation.step_time, **p.counts()})
        except InfeasibleBudgetError as exc:
            rows.append({"policy": name, "feasible": False, "peak": exc.required,
                         "step_time": None})

    def render(console: Any) -> None:
        from rich.table import Table

        at = "no budget" if budget is None else format_bytes(budget)
        title = f"{label}: every policy at {at}"
        table = Table(title=title)
        for col in ("policy", "fits", "peak", "step (ms)", "keep", "offload", "recompute"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for r in rows:
            step = "-" if r["step_time"] is None else f"{r['step_time'] * 1e3:.2f}"
            table.add_row(r["policy"], "yes" if r["feasible"] else "[red]no[/red]",
                          format_bytes(r["peak"]), step, str(r.get("keep", "-")),
                          str(r.get("offload", "-")), str(r.get("recompute", "-")))
        console.print(table)

    emit(args, render)
    return {"model": label, "budget": budget, "policies": rows}


def cmd_explain(args: argparse.Namespace) -> dict[str, Any]:
    planned, label = _planned(args)
    rows = planned.explain()
    shown = rows if args.limit == 0 else rows[: args.limit]

    def render(console: Any) -> None:
        from rich.table import Table

        bound = "" if planned.gap is None else (
            f"; step {planned.simulation.step_time * 1e3:.2f} ms, lower bound "
            f"{planned.lower_bound * 1e3:.2f} ms, gap {planned.gap * 100:.1f}%")
        table = Table(title=f"{label}: {planned.plan.policy} decisions "
                            f"({len(shown)} of {len(rows)} activations){bound}")
        for col in ("tensor", "bytes", "producer", "decision", "why"):
            table.add_column(col, overflow="fold")
        for r in shown:
            table.add_row(r["tensor"], format_bytes(r["bytes"]), r["producer"], r["decision"],
                          r["why"])
        console.print(table)

    emit(args, render)
    return {"model": label, "policy": planned.plan.policy, "tensors": rows,
            "lower_bound": planned.lower_bound, "gap": planned.gap}


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from outcore.api import compile as compile_step

    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    model, loss_fn, batch, label = load_workload(args, fake=False)
    trainer = compile_step(model, loss_fn, batch, budget=_budget(args), device="cpu-emulated",
                           gpu=args.gpu, policy=args.policy)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses: list[float] = []
    from rich.progress import Progress

    with Progress(disable=args.json) as progress:
        task = progress.add_task(f"training {label}", total=args.steps)
        for _ in range(args.steps):
            optimizer.zero_grad()
            losses.append(float(trainer.step(*batch)))
            optimizer.step()
            progress.advance(task)
    trainer.close()
    stats = trainer.stats
    result = {"model": label, "policy": trainer.plan.policy, "losses": losses,
              "budget": trainer.budget, "measured_peak": stats.measured_peak,
              "predicted_peak": stats.predicted_peak, "step_seconds": stats.step_seconds}
    emit(args, lambda console: console.print(
        f"{label}: {args.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; {stats}"))
    return result


def cmd_reproduce(args: argparse.Namespace) -> dict[str, Any]:
    import runpy
    import sys

    papers = ("vdnn", "superneurons", "modnn", "pooch", "dymem")
    if args.paper not in papers:
        raise UsageError(f"unknown paper {args.paper!r}; choose one of {', '.join(papers)}")
    root = Path(__file__).resolve().parents[2]
    script = root / "benchmarks" / f"repro_{args.paper}.py"
    if not script.exists():
        raise UsageError(f"{script} is not here: run `outcore reproduce` from a source checkout")
    argv = [str(script)] + (["--quick"] if args.quick else [])
    saved, sys.argv = sys.argv, argv
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    return {"paper": args.paper, "script": str(script)}


def cmd_profile(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.cost.profiles import profiles

    if args.list:
        table = {name: p.to_dict() for name, p in profiles().items()}

        def render_list(console: Any) -> None:
            from rich.table import Table

            t = Table(title="GPU profiles")
            for col in ("name", "memory", "fp32 TFLOP/s", "h2d GB/s", "d2h GB/s", "engines"):
                t.add_column(col)
            for name, p in profiles().items():
                t.add_row(name, format_bytes(p.memory), f"{p.peak('float32') / 1e12:.1f}",
                          f"{p.bandwidth('h2d') / 1e9:.1f}", f"{p.bandwidth('d2h') / 1e9:.1f}",
                          str(p.copy_engines))
            console.print(t)

        emit(args, render_list)
        return {"profiles": table}
    from outcore.cost.measure_host import measure_this_cpu

    host = measure_this_cpu()
    result: dict[str, Any] = {"this-cpu": host.to_dict()}
    if args.model:
        from outcore.cost.measure_ops import measure_ops

        graph, _ = _capture(args, fake=False)
        measured = measure_ops(graph)
        result["ops"] = len(graph.ops)
        if args.out:
            measured.save(args.out)
            result["saved"] = args.out
    emit(args, lambda console: console.print(
        f"this CPU: {host.peak('float32') / 1e9:.1f} GFLOP/s fp32, copies "
        f"{host.bandwidth('h2d') / 1e9:.1f} GB/s" + (f"; op profile of {args.model} saved to "
                                                        f"{args.out}" if args.out else "")))
    return result
