"""The planning subcommands: plan, simulate, compare, explain, run (parsing: ``outcore.cli``;
catalogues, reproduce and profile: ``outcore.cli_catalog``).

Each ``cmd_*`` returns a JSON-able dict (printed with --json) and renders rich tables
otherwise. Arguments are checked (``cli_workload.check``) before anything is captured;
errors are raised and ``outcore.cli.main`` maps them to exit codes.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from outcore import cli_workload as work
from outcore.cli import emit
from outcore.errors import OutcoreError
from outcore.units import format_bytes

LISTS = {"list_models": "models", "list_gpus": "gpus", "list_policies": "policies"}


def handler(args: argparse.Namespace) -> Any:
    """The function that runs ``args.command`` (a --list-* flag runs that catalogue)."""
    from outcore import cli_catalog

    for flag, command in LISTS.items():
        if getattr(args, flag, False):
            return getattr(cli_catalog, f"cmd_{command}")
    name = f"cmd_{args.command}"
    return globals().get(name) or getattr(cli_catalog, name)


def summary(planned: Any, label: str) -> dict[str, Any]:
    """The JSON summary of a plan (shared by plan and simulate)."""
    sim = planned.simulation
    return {
        "model": label, "policy": planned.plan.policy, "budget": planned.budget,
        "predicted_peak": planned.predicted_peak, "scope": planned.scope,
        "scoped_peak": planned.scoped_peak, "decisions": planned.counts(),
        "sub_batches": planned.plan.sub_batches, "notes": list(planned.notes),
        "instructions": len(planned.schedule),
        "simulation": sim.to_dict() if sim is not None else None,
        "lower_bound": planned.lower_bound, "gap": planned.gap,
        **weights_summary(planned),
    }


def weights_summary(planned: Any) -> dict[str, Any]:
    """The weights part of a plan's JSON (planned with --optimizer), else nothing."""
    report = getattr(planned, "weights", None)
    if report is None:
        return {}
    from outcore.weights.report import tokens_per_step

    tokens = tokens_per_step(planned.graph)
    return {"weights": report.to_dict(), "tokens_per_step": tokens,
            "tokens_per_second": tokens / report.total_seconds
            if tokens and report.total_seconds > 0 else None}


def _weights_rows(table: Any, planned: Any) -> None:
    """``outcore plan``'s rows for the weights (planned with --optimizer)."""
    w = planned.weights
    if w is None:
        return
    found = weights_summary(planned)
    table.add_row("parameters held in host memory",
                  f"{len(w.held)} of {w.parameters} ({format_bytes(w.held_weights)})")
    table.add_row(f"{w.optimizer} state on the device", format_bytes(w.device_state))
    table.add_row("host memory needed", format_bytes(w.host_bytes))
    table.add_row("pinned host memory", f"{format_bytes(w.pinned)} "
                  f"({w.pinned_ratio:.3f}x the host copies)")
    table.add_row("optimizer step", f"{w.optimizer_seconds * 1e3:.2f} ms")
    table.add_row("step with optimizer", f"{w.total_seconds * 1e3:.2f} ms")
    if found.get("tokens_per_second"):
        table.add_row("tokens per second", f"{found['tokens_per_second']:.0f}")


def _print_notes(console: Any, notes: list[str]) -> None:
    from rich.markup import escape

    for text in notes:
        console.print(f"[bold yellow]note:[/bold yellow] {escape(text)}")


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    if args.gpus > 1:
        from outcore.cli import UsageError
        from outcore.distributed.cli import cmd_plan_gpus

        if args.scope != "step":
            raise UsageError("--scope activations plans one GPU's step; leave out --gpus")
        if getattr(args, "optimizer", None) is not None:  # was silently ignored
            raise UsageError("--optimizer plans one GPU's parameters, gradients and optimizer "
                             "state; data-parallel ranks keep their weights on the device. "
                             "Leave out --gpus (or --optimizer)")
        work.check(args)
        return cmd_plan_gpus(args)
    planned, label = work.planned(args)
    result = summary(planned, label)
    if args.optimizer is not None:  # the masters are in host_state (``optimizer_spec``)
        result["master_weights"] = args.master_weights

    def render(console: Any) -> None:
        from rich.table import Table

        table = Table(title=f"outcore plan: {label}, policy {planned.plan.policy}")
        table.add_column("quantity")
        table.add_column("value", justify="right")
        budget = "unbounded" if planned.budget is None else format_bytes(planned.budget)
        table.add_row("budget", budget)
        table.add_row("the budget bounds", "activations only (parameters, inputs and their "
                      "gradients left out)" if planned.scope == "activations"
                      else "the whole step")
        table.add_row("predicted peak", format_bytes(planned.predicted_peak))
        if planned.scope == "activations":
            table.add_row("predicted activation peak", format_bytes(planned.scoped_peak))
        for decision, count in planned.counts().items():
            table.add_row(f"activations {decision}", str(count))
        table.add_row("sub-batches", str(planned.plan.sub_batches))
        if planned.simulation is not None:
            sim = planned.simulation
            table.add_row(f"simulated step ({sim.cost_model})", f"{sim.step_time * 1e3:.2f} ms")
            table.add_row("exposed transfer", f"{sim.exposed_transfer_time * 1e3:.2f} ms")
        _weights_rows(table, planned)
        if planned.gap is not None:
            table.add_row("lower bound (any placement and plan)" if planned.weights else
                          "lower bound (any plan)", f"{planned.lower_bound * 1e3:.2f} ms")
            table.add_row("gap to the bound", f"{planned.gap * 100:.1f}%")
        console.print(table)
        _print_notes(console, planned.notes)

    emit(args, render)
    return result


def cmd_simulate(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.report.files import check_folder, output_folder
    from outcore.report.html import write_html
    from outcore.report.snapshot import write_snapshot
    from outcore.report.timeline import plot_memory
    from outcore.report.trace import write_trace

    check_folder(args.out)  # before the capture, like every other argument
    planned, label = work.planned(args)
    out = output_folder(args.out)
    png = plot_memory(planned.simulation, out / "memory.png", graph=planned.graph,
                      schedule=planned.schedule, budget=planned.budget,
                      title=f"{label}: {planned.plan.policy}")
    trace = write_trace(out / "trace.json", planned.simulation, planned.graph,
                        planned.schedule, model=args.model)
    report = write_html(planned, out / "report.html", title=f"outcore plan: {label}")
    snapshot = write_snapshot(out / "memory_snapshot.pickle", planned.simulation,
                              planned.graph, planned.schedule)
    result = summary(planned, label) | {"plot": str(png), "trace": str(trace),
                                        "report": str(report), "snapshot": str(snapshot)}
    emit(args, lambda console: console.print(
        f"[bold]{label}[/bold], policy {planned.plan.policy}\n{planned.simulation.summary()}\n"
        f"wrote {png}, {trace}, {report} and {snapshot} (open the last in "
        "https://pytorch.org/memory_viz)"))
    return result


def cmd_compare(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.errors import InfeasibleBudgetError
    from outcore.policies import names

    work.check(args)
    if args.gpus > 1:
        from outcore.distributed.cli import cmd_compare_gpus

        return cmd_compare_gpus(args)
    graph, label = work.capture(args, fake=not getattr(args, "real", False))
    budget = work.budget(args)
    rows = []
    for name in names():
        try:
            p = work.plan_policy(args, graph, name)
            rows.append({"policy": name, "feasible": True, "peak": p.predicted_peak,
                         "step_time": p.simulation.step_time, **p.counts()})
        except InfeasibleBudgetError as exc:
            rows.append({"policy": name, "feasible": False, "peak": exc.required,
                         "step_time": None})

    def render(console: Any) -> None:
        from rich.table import Table

        at = "no budget" if budget is None else format_bytes(budget)
        table = Table(title=f"{label}: every policy at {at}")
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
    from outcore.report.explain import RICH_STYLES, binding_line, common_suffix

    planned, label = work.planned(args)
    rows = planned.explain()
    shown = rows if args.limit == 0 else rows[: args.limit]
    shared = common_suffix(shown)

    def render(console: Any) -> None:
        from rich.markup import escape
        from rich.table import Table

        bound = "" if planned.gap is None else (
            f"; step {planned.simulation.step_time * 1e3:.2f} ms, lower bound "
            f"{planned.lower_bound * 1e3:.2f} ms, gap {planned.gap * 100:.1f}%")
        table = Table(title=f"{label}: {planned.plan.policy} decisions "
                            f"({len(shown)} of {len(rows)} activations, by decision, "
                            f"largest first){bound}")
        for col in ("module", "op", "size", "decision", "cost (ms)", "frees at binding", "why"):
            table.add_column(col, overflow="fold",
                             justify="left" if col in ("module", "op", "decision", "why")
                             else "right")
        for r in shown:
            style = RICH_STYLES.get(r["decision"], "")
            why = r["why"][: len(r["why"]) - len(shared)] if shared else r["why"]
            cost = "-" if r["cost_s"] is None else f"{r['cost_s'] * 1e3:.3f}"
            table.add_row(escape(r["module"]), escape(r["op"]), r["size"],
                          f"[{style}]{r['decision']}[/{style}]" if style else r["decision"],
                          cost, format_bytes(r["frees"]) if r["frees"] else "-", escape(why))
        console.print(table)
        console.print(escape(binding_line(rows)))
        if shared:
            console.print(f"every row above also: {escape(shared.strip('; '))}")
        _print_weights(console, planned)
        _print_notes(console, rows.notes)

    emit(args, render)
    return {"model": label, "policy": planned.plan.policy, "notes": rows.notes,
            "tensors": list(rows), "lower_bound": planned.lower_bound, "gap": planned.gap,
            "binds": rows.binds, "binding": [dataclasses.asdict(b) for b in rows.binding],
            **weights_summary(planned),
            "parameters": list(planned.weights.rows) if planned.weights else []}


def _print_weights(console: Any, planned: Any) -> None:
    """``outcore explain``'s table of the parameters held in host memory, and the
    candidates the chooser planned (planned with --optimizer)."""
    w = planned.weights
    if w is None:
        return
    from rich.markup import escape
    from rich.table import Table

    console.print(escape(w.summary()))
    if w.rows:
        table = Table(title=f"parameters held in host memory ({len(w.rows)})")
        for col in ("parameter", "size", "why"):
            table.add_column(col, overflow="fold")
        for r in w.rows:
            table.add_row(escape(r["parameter"]), r["size"], escape(r["why"]))
        console.print(table)
    for line in w.lines:
        if "held in host memory (prefetched" not in line:
            console.print(f"  {escape(line)}")


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    """Train ``--steps`` steps on the emulated device, with SGD and only the activations
    planned, or with ``--optimizer`` under the weights plan (``outcore plan --optimizer``'s,
    with its --weights and --host-adam-rate: ``outcore.weights.compile``, each step
    ``train_step``)."""
    from outcore.api import compile as compile_step
    from outcore.distributed.cli import launch_nproc, rank_share
    from outcore.validation import check_positive_int

    work.check(args)
    check_positive_int(args.steps, "--steps")
    work.check_training(args)
    if args.nproc > 1:
        argv = [a for i, a in enumerate(args.argv) if not a.startswith("--nproc")
                and (i == 0 or args.argv[i - 1] != "--nproc")]
        code = launch_nproc(argv, args.nproc)
        if code:
            raise OutcoreError(f"a rank of `outcore run --nproc {args.nproc}` failed "
                               f"(exit code {code}); its error is printed above")
        return {"nproc": args.nproc, "exit_code": code}
    model, loss_fn, full, label = work.load_workload(args, fake=False)
    batch, distributed = rank_share(full)
    master = None
    if args.master_weights:  # checked: with --optimizer
        from outcore.weights.mixed import MasterWeights

        work.check_masters({n: str(p.dtype).removeprefix("torch.")
                            for n, p in model.named_parameters()})
        master = MasterWeights(model)
    optimizer = work.optimizer_for(args, master.parameters() if master is not None
                                   else model.parameters())
    if args.optimizer is not None:  # checked: a budget, one process, no --option
        from outcore.weights import compile as compile_weights

        if distributed:
            from outcore.cli import UsageError

            raise UsageError(f"outcore run --optimizer {args.optimizer} runs one process; "
                             "it was started under torchrun with WORLD_SIZE > 1")

        trainer = compile_weights(model, loss_fn, batch, optimizer=optimizer,
                                  budget=work.budget(args), device="cpu-emulated",
                                  gpu=args.gpu, weights=args.weights or "auto",
                                  host_adam_rate=args.host_adam_rate, master=master)
    else:
        trainer = compile_step(model, loss_fn, batch, budget=work.budget(args),
                               device="cpu-emulated", gpu=args.gpu, policy=args.policy,
                               allow_sub_batches=work.allow_sub_batches(args),
                               cache=False if args.no_cache else None,
                               distributed=distributed, **work.options(args))
    # one batch for model(**batch) / a model returning its own loss, else (x, y)
    step_args = (batch,) if loss_fn is None or isinstance(batch, Mapping) else tuple(batch)
    try:
        losses = _train(trainer, optimizer, step_args, args.steps, label,
                        weights=args.optimizer is not None)
    finally:
        trainer.close()
    kind = type(optimizer).__name__
    if args.optimizer is not None:
        return _weights_run_result(args, trainer, label, kind, losses)
    stats = trainer.stats
    result = {"model": label, "optimizer": kind, "policy": trainer.plan.policy,
              "losses": losses, "budget": trainer.budget, "measured_peak": stats.measured_peak,
              "predicted_peak": stats.predicted_peak, "step_seconds": stats.step_seconds,
              "sub_batches": stats.sub_batches, "notes": stats.notes}
    emit(args, lambda console: console.print(
        f"{label}: {args.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; {stats}"))
    return result


def _train(trainer: Any, optimizer: Any, step_args: tuple[Any, ...], steps: int, label: str,
           *, weights: bool) -> list[float]:
    """The losses of ``steps`` training steps on ``step_args``: the weights trainer's
    ``train_step`` (the optimizer step where the plan put it), else the Trainer's step
    between ``zero_grad`` and ``optimizer.step()``; with a progress bar."""
    from rich.progress import BarColumn, Progress, TextColumn

    from outcore import progress as feedback

    losses: list[float] = []
    # the label is the user's text (no markup, no emoji codes such as ":llama:")
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                  disable=not feedback.enabled(), transient=True) as bar:
        task = bar.add_task(f"training {label}", total=steps)
        for _ in range(steps):
            if weights:
                losses.append(float(trainer.train_step(*step_args)))
            else:
                optimizer.zero_grad()
                losses.append(float(trainer.step(*step_args)))
                optimizer.step()
            bar.advance(task)
    return losses


def _weights_run_result(args: argparse.Namespace, trainer: Any, label: str, kind: str,
                        losses: list[float]) -> dict[str, Any]:
    """``outcore run --optimizer``'s JSON and line: the losses, the peaks, the parameters
    held in host memory, and the plan's memory under ``outcore plan --json``'s names and
    meanings (``outcore.weights.report.HOST_KEYS``: ``host_bytes`` is the step's host
    copies plus the host-held optimizer state)."""
    from outcore.plan.memory import memory_curve
    from outcore.weights.report import build_report

    choice = trainer.choice
    held = trainer.held()
    report = build_report(trainer.graph, choice, kind.lower(), args.weights or "auto",
                          memory_curve(trainer.graph, choice.schedule).host)
    result = {"model": label, "optimizer": kind, "policy": choice.plan.policy,
              "losses": losses, "budget": work.budget(args),
              "measured_peak": trainer.measured_peak,
              "predicted_peak": trainer.predicted_peak, "held": held,
              "parameters": len(trainer.state), "master_weights": trainer.master is not None,
              **report.host_memory()}
    masters = " on fp32 master weights" if trainer.master is not None else ""
    emit(args, lambda console: console.print(
        f"{label}: {args.steps} steps with {kind}{masters}, loss {losses[0]:.4f} -> "
        f"{losses[-1]:.4f}; "
        f"peak {format_bytes(trainer.measured_peak)} (predicted "
        f"{format_bytes(trainer.predicted_peak)}) + {kind} state "
        f"{format_bytes(choice.device_state)} on the device; {len(held)} of "
        f"{len(trainer.state)} parameters held in host memory; host memory "
        f"{format_bytes(report.host_bytes)} (pinned {format_bytes(report.pinned)})",
        markup=False))
    return result
