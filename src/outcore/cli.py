"""The ``outcore`` command: plan, simulate, run, compare, reproduce, explain, profile.

Exit codes: 0 success; 1 an unexpected error; 2 bad arguments (one line, no traceback);
3 the budget cannot be met (InfeasibleBudgetError); 4 the device ran out of memory.
Every command takes ``--json`` to print machine-readable output instead of tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from outcore.errors import DeviceOutOfMemory, InfeasibleBudgetError, OutcoreError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INFEASIBLE, EXIT_OOM = 0, 1, 2, 3, 4


class UsageError(Exception):
    """Bad arguments: reported in one line with exit code 2."""


def _model_arguments(p: argparse.ArgumentParser, *, default_fake: bool) -> None:
    p.add_argument("--model", required=True,
                   help="a zoo name (see `outcore plan --list-models`) or module:function "
                        "returning (model, loss_fn, (x, y))")
    p.add_argument("--batch", type=int, default=32, help="mini-batch size (zoo models)")
    p.add_argument("--small", action="store_true",
                   help="zoo: the reduced-width version of the network (fits this CPU)")
    if default_fake:
        p.add_argument("--real", action="store_true",
                       help="capture real tensors (default: fake, sizes only)")


def _planning_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", default=None, help='device memory budget, e.g. "12GB", "11.5GiB"')
    p.add_argument("--gpu", default=None, help="hardware profile (default v100-pcie); "
                   "see `outcore profile --list`")
    p.add_argument("--policy", default="auto", help="policy name (see `outcore compare`)")


def _gpus_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=1, help="data parallel: simulate N GPUs, each "
                   "with its share of --batch (budget per GPU)")
    p.add_argument("--host", default=None, help="multi-GPU host profile for --gpus (default "
                   "the GPU's; e.g. v100-pcie-x8, dgx1-v100, k40m-x2)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outcore", description=(
        "Train networks whose training memory exceeds the accelerator's: plan, simulate "
        "and run keep/offload/recompute schedules."))
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("plan", help="plan a model under a budget: decisions, peak, time")
    _model_arguments(p, default_fake=True)
    _planning_arguments(p)
    _gpus_arguments(p)
    p.add_argument("--list-models", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("simulate", help="simulate a plan on a GPU profile; write plot, trace, HTML")
    _model_arguments(p, default_fake=True)
    _planning_arguments(p)
    p.add_argument("--out", default="out", help="folder for memory.png, trace.json, report.html")

    p = sub.add_parser("run", help="train N steps on the CPU-emulated device")
    _model_arguments(p, default_fake=False)
    _planning_arguments(p)
    p.add_argument("--steps", type=int, default=3, help="training steps to run")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel ranks on this machine "
                   "(started under torchrun, gloo, each with its share of --batch)")

    p = sub.add_parser("compare", help="every policy side by side at one budget")
    _model_arguments(p, default_fake=True)
    _planning_arguments(p)
    _gpus_arguments(p)

    p = sub.add_parser("explain", help="per tensor: what was decided and why")
    _model_arguments(p, default_fake=True)
    _planning_arguments(p)
    p.add_argument("--limit", type=int, default=40, help="rows to show (0 = all)")

    p = sub.add_parser("reproduce", help="run a paper's reproduction benchmark")
    p.add_argument("paper", help="vdnn, superneurons, modnn, pooch or dymem")
    p.add_argument("--quick", action="store_true", help="a smaller, faster run")

    p = sub.add_parser("profile", help="measure this machine (and optionally a model's ops)")
    p.add_argument("--list", action="store_true", help="list the GPU profiles instead")
    p.add_argument("--model", default=None, help="also time every op of this zoo model")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--small", action="store_true")
    p.add_argument("--out", default=None, help="write the op profile JSON here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``outcore`` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed a one-line usage error or --help
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    from outcore import cli_commands

    args.argv = list(argv) if argv is not None else sys.argv[1:]  # run --nproc re-launches
    handler = getattr(cli_commands, f"cmd_{args.command}")
    try:
        result = handler(args)
    except UsageError as exc:
        print(f"outcore {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except InfeasibleBudgetError as exc:
        _fail(args, exc)
        return EXIT_INFEASIBLE
    except DeviceOutOfMemory as exc:
        _fail(args, exc)
        return EXIT_OOM
    except (OutcoreError, ValueError, KeyError) as exc:
        _fail(args, exc)
        return EXIT_USAGE if isinstance(exc, (ValueError, KeyError)) else EXIT_ERROR
    if args.json and result is not None:
        print(json.dumps(result, indent=2, default=str))
    return EXIT_OK


def _fail(args: argparse.Namespace, exc: BaseException) -> None:
    message = str(exc).strip("'\"")
    if args.json:
        print(json.dumps({"error": type(exc).__name__, "message": message}))
    else:
        print(f"outcore {args.command}: {type(exc).__name__}: {message}", file=sys.stderr)


def emit(args: argparse.Namespace, render: Any) -> None:
    """Call ``render(console)`` unless --json is set."""
    if args.json:
        return
    from rich.console import Console

    render(Console())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
