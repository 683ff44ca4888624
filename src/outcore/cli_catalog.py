"""The catalogue subcommands (models, gpus, policies), reproduce and profile.

The catalogues answer in about a second (no capture, no planning); ``--list-models``,
``--list-gpus`` and ``--list-policies`` on the planning commands run the same functions.
"""

from __future__ import annotations

import argparse
from typing import Any

from outcore.cli import emit
from outcore.units import format_bytes


def _table(args: argparse.Namespace, title: str, columns: list[str],
           rows: list[list[str]]) -> None:
    def render(console: Any) -> None:
        from rich.table import Table

        table = Table(title=title)
        for col in columns:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)

    emit(args, render)


def cmd_models(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.zoo.catalog import ENTRIES

    rows = [{"name": e.name, "description": e.description} for e in ENTRIES]
    _table(args, "zoo models (--model NAME; --small for the reduced width)",
           ["name", "description"], [[r["name"], r["description"]] for r in rows])
    return {"models": rows}


def cmd_gpus(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.cost.profiles import profiles

    found = profiles()
    rows: list[dict[str, Any]] = [{"name": name, "aliases": list(p.aliases), "memory": p.memory,
             "peak_tflops": {k: v / 1e12 for k, v in p.peak_flops.items()},
             "h2d": p.bandwidth("h2d"), "d2h": p.bandwidth("d2h"),
             "copy_engines": p.copy_engines} for name, p in found.items()]
    _table(args, "GPU profiles (--gpu NAME; this-cpu measures this machine)",
           ["name", "aliases", "memory", "fp32 TFLOP/s", "dtypes", "h2d GB/s", "engines"],
           [[r["name"], ", ".join(r["aliases"]), format_bytes(r["memory"]),
             f"{r['peak_tflops']['float32']:.1f}", ", ".join(sorted(r["peak_tflops"])),
             f"{r['h2d'] / 1e9:.1f}", str(r["copy_engines"])] for r in rows])
    return {"gpus": rows}


def cmd_policies(args: argparse.Namespace) -> dict[str, Any]:
    from outcore.policies.registry import get, names

    rows = [{"name": n, "paper": get(n).paper, "description": get(n).description}
            for n in names()]
    _table(args, "policies (--policy NAME; auto = outcore-auto)",
           ["name", "paper", "description"],
           [[r["name"], r["paper"], r["description"]] for r in rows])
    return {"policies": rows}


def cmd_reproduce(args: argparse.Namespace) -> dict[str, Any]:
    from outcore import progress
    from outcore.errors import UnknownPaperError
    from outcore.reproduce import PAPERS, run

    if args.paper not in PAPERS:
        raise UnknownPaperError(args.paper, f"one of {', '.join(PAPERS)}")
    if args.json:  # the tables go into the JSON document, not around it
        import contextlib
        import io

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            code = run(args.paper, args.quick)
        return {"paper": args.paper, "quick": args.quick, "exit_code": code,
                "output": buffer.getvalue()}
    with progress.task(f"reproducing {args.paper}{' (quick)' if args.quick else ''}"):
        code = run(args.paper, args.quick)
    return {"paper": args.paper, "quick": args.quick, "exit_code": code}


def cmd_profile(args: argparse.Namespace) -> dict[str, Any]:
    from outcore import progress

    if args.list:
        return cmd_gpus(args)
    if args.model:
        from outcore.validation import check_model, check_positive_int

        check_model(args.model)
        check_positive_int(args.batch, "--batch")
    out = None
    if args.out:
        from outcore.report.files import check_writable

        out = check_writable(args.out)
    from outcore.cost.measure_host import measure_this_cpu

    with progress.task("measuring this CPU"):
        host = measure_this_cpu()
    result: dict[str, Any] = {"this-cpu": host.to_dict()}
    if args.model:
        from outcore import cli_workload
        from outcore.cost.measure_ops import measure_ops

        args.no_cache = True  # the ops are timed on a real capture
        graph, _ = cli_workload.capture(args, fake=False)
        with progress.task(f"timing {len(graph.ops)} ops"):
            measured = measure_ops(graph)
        result["ops"] = len(graph.ops)
        if out is not None:
            from outcore.report.files import write_text

            write_text(out, measured.to_json())
            result["saved"] = str(out)
    emit(args, lambda console: console.print(
        f"this CPU: {host.peak('float32') / 1e9:.1f} GFLOP/s fp32, copies "
        f"{host.bandwidth('h2d') / 1e9:.1f} GB/s" + (
            f"; op profile of {args.model} saved to {out} (plan with it: outcore plan "
            f"--model {args.model} --batch {args.batch} --real --cost {out})" if out else "")))
    return result
