"""The data-parallel side of the ``outcore`` command: ``plan --gpus N``, ``compare --gpus
N`` (simulated, no GPU needed) and ``run --nproc N`` (started under torchrun).

``--gpus N`` plans one rank at ``--batch / N`` on the GPU's multi-GPU host (``--host``,
default the GPU's, see ``outcore.cost.interconnects``): the host link shared by the ranks,
the all-reduce of its gradient buckets on the host's interconnect overlapped with
backward, and reports the speed-up over the whole batch on one GPU at the same budget.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from outcore.units import format_bytes


def _host(args: argparse.Namespace) -> Any:
    from outcore.cost.interconnects import default_host, get_host

    return get_host(args.host) if getattr(args, "host", None) else default_host(args.gpu)


def _rank_graph(args: argparse.Namespace, gpus: int) -> tuple[Any, str]:
    from outcore.capture import capture
    from outcore.cli import UsageError
    from outcore.cli_workload import load_workload

    if args.batch % gpus:
        raise UsageError(f"--batch {args.batch} does not split into {gpus} equal shares")
    share = argparse.Namespace(**{**vars(args), "batch": args.batch // gpus})
    model, loss_fn, batch, label = load_workload(share, fake=not getattr(args, "real", False))
    return capture(model, loss_fn, batch, fake=not getattr(args, "real", False)), label


def data_parallel_row(args: argparse.Namespace, policy: str, gpus: int,
                      graph: Any) -> dict[str, Any]:
    """Plan one rank of ``gpus`` with ``policy`` and simulate the data-parallel step."""
    from outcore.api import cost_model_for, plan
    from outcore.cli_workload import budget as _budget
    from outcore.distributed.compile import plan_rank
    from outcore.plan.grad_buckets import graph_tied_gradients
    from outcore.sim.multi_gpu import rank_cost_model, simulate_data_parallel

    host = _host(args)
    base = cost_model_for(args.gpu or host.gpu)
    cost = rank_cost_model(base.profile, host, gpus, variants=base.variants)
    if gpus == 1:
        planned = plan(graph, _budget(args), policy=policy, cost=cost, simulate=False)
    else:
        planned, _ = plan_rank(graph, _budget(args), policy, cost, None, 25 << 20, gpus, {},
                               tied=graph_tied_gradients(graph))
    result = simulate_data_parallel(planned.graph, planned.schedule, cost, host, gpus)
    return {"policy": policy, "gpus": gpus, "sub_batches": planned.plan.sub_batches,
            **result.to_dict()}


def cmd_plan_gpus(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.cli import emit

    gpus = args.gpus
    graph, label = _rank_graph(args, gpus)
    row = data_parallel_row(args, args.policy, gpus, graph)
    one_graph, _ = _rank_graph(args, 1)
    one = data_parallel_row(args, args.policy, 1, one_graph)
    row["speedup_over_one_gpu"] = one["step_time"] / row["step_time"]

    def render(console: Any) -> None:
        from rich.table import Table

        table = Table(title=f"outcore plan: {label} per rank on {gpus} GPUs ({row['host']}), "
                            f"policy {args.policy}")
        table.add_column("quantity")
        table.add_column("value", justify="right")
        table.add_row("predicted peak per rank (with buckets)", format_bytes(row["peak_bytes"]))
        table.add_row("host link per rank (d2h/h2d)",
                      f"{row['d2h_gbs']:.1f} / {row['h2d_gbs']:.1f} GB/s")
        table.add_row("rank step", f"{row['rank_step_time'] * 1e3:.2f} ms")
        n = row["buckets"]
        table.add_row(f"all-reduce ({n} bucket{'' if n == 1 else 's'})",
                      f"{row['comm_time'] * 1e3:.2f} ms")
        table.add_row("all-reduce not hidden by backward",
                      f"{row['exposed_comm_time'] * 1e3:.2f} ms")
        table.add_row("data-parallel step", f"{row['step_time'] * 1e3:.2f} ms")
        table.add_row("one GPU, whole batch, same budget", f"{one['step_time'] * 1e3:.2f} ms")
        table.add_row("speed-up", f"{row['speedup_over_one_gpu']:.2f}x")
        console.print(table)

    emit(args, render)
    return {"model": label, "policy": args.policy, **row}


def cmd_compare_gpus(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.cli import emit
    from outcore.errors import InfeasibleBudgetError
    from outcore.policies import names

    graph, label = _rank_graph(args, args.gpus)
    rows = []
    for name in names():
        try:
            rows.append({"feasible": True, **data_parallel_row(args, name, args.gpus, graph)})
        except InfeasibleBudgetError as exc:
            rows.append({"policy": name, "feasible": False, "peak_bytes": exc.required,
                         "step_time": None})

    def render(console: Any) -> None:
        from rich.table import Table

        table = Table(title=f"{label} per rank, {args.gpus} GPUs: every policy")
        for col in ("policy", "fits", "peak/rank", "step (ms)", "all-reduce exposed (ms)"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for r in rows:
            fits = r["feasible"]
            table.add_row(r["policy"], "yes" if fits else "[red]no[/red]",
                          format_bytes(r["peak_bytes"]),
                          f"{r['step_time'] * 1e3:.2f}" if fits else "-",
                          f"{r['exposed_comm_time'] * 1e3:.2f}" if fits else "-")
        console.print(table)

    emit(args, render)
    return {"model": label, "gpus": args.gpus, "policies": rows}


def launch_nproc(argv: list[str], nproc: int) -> int:
    """Run ``outcore <argv>`` on ``nproc`` ranks under torchrun (``torch.distributed.run``)
    on this machine; returns its exit code."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "outcore.cli", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(command, env=env, check=False).returncode


def rank_share(batch: Any) -> tuple[Any, bool]:
    """This rank's share of ``batch`` when running under torchrun (WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return batch, False
    from outcore.runtime.subbatch import split_batch

    return split_batch(tuple(batch), world)[int(os.environ.get("RANK", "0"))], True
