"""The ``outcore`` command: plan, simulate, run, compare, explain, reproduce, profile, and the
catalogues (models, gpus, policies).

Exit codes, one per class of error (documented in docs/guide.md):

    0  success
    1  an unexpected error (a bug: please report it with the traceback of ``--debug``)
    2  bad arguments: an unknown policy, option, GPU, model or device, an unreadable, zero,
       negative or non-finite budget (argparse's own errors too); checked before any capture
    3  the budget cannot be met (InfeasibleBudgetError)
    4  the device ran out of memory (DeviceOutOfMemory)
    5  the model could not be captured (CaptureError)
    6  an output could not be written (OutputPathError)
    130 interrupted (Ctrl-C)
    141 stdout was closed by its reader (``outcore --json ... | head -1``): ended quietly,
        as a program stopped by SIGPIPE reports to the shell (128 + 13)

``--json`` (machine-readable output, no tables, no progress) and ``--no-cache`` (plan again
even when the plan cache holds this plan) are accepted anywhere on the command line.

``--model module:function`` imports ``module`` and calls ``function()``: it runs your code,
as ``uvicorn module:app`` does; only name modules you trust.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from outcore.errors import (
    CaptureError,
    DeviceOutOfMemory,
    InfeasibleBudgetError,
    InvalidArgumentError,
    OutcoreError,
    OutcoreWarning,
    OutputPathError,
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INFEASIBLE, EXIT_OOM = 0, 1, 2, 3, 4
EXIT_CAPTURE, EXIT_OUTPUT, EXIT_INTERRUPTED, EXIT_PIPE = 5, 6, 130, 141

#: Flags accepted anywhere on the command line (moved to the front before parsing).
GLOBAL_FLAGS = ("--json", "--no-cache", "--debug")
#: ``--optimizer`` of plan, explain and run: the optimizers whose state the weights plan sizes
OPTIMIZERS = ("adamw", "adam", "sgd")


class UsageError(InvalidArgumentError):
    """Bad arguments: reported in one line with exit code 2."""

    template = "{value}"

    def __init__(self, message: str) -> None:
        super().__init__(message, "")


def _exit_code(exc: BaseException) -> int:
    """The exit code of an error (see the module docstring)."""
    table: list[tuple[type[BaseException], int]] = [
        (InvalidArgumentError, EXIT_USAGE), (InfeasibleBudgetError, EXIT_INFEASIBLE),
        (DeviceOutOfMemory, EXIT_OOM), (CaptureError, EXIT_CAPTURE),
        (OutputPathError, EXIT_OUTPUT), (KeyboardInterrupt, EXIT_INTERRUPTED)]
    for kind, code in table:
        if isinstance(exc, kind):
            return code
    return EXIT_ERROR


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` -> (key, value), the value read as int, float, bool, None or str."""
    from outcore.errors import InvalidOptionError

    key, sep, raw = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise InvalidOptionError(text, "key=value with a Python identifier as the key, e.g. "
                                 "--option portfolio=false")
    low = raw.strip().lower()
    value: Any
    if low in ("true", "yes", "on"):
        value = True
    elif low in ("false", "no", "off"):
        value = False
    elif low in ("none", "null"):
        value = None
    else:
        try:
            value = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                value = raw
    if key.strip() in PLAN_ARGUMENTS:
        raise InvalidOptionError(text, f"a policy option; {key.strip()!r} is an argument of "
                                 f"outcore.plan itself: {PLAN_ARGUMENTS[key.strip()]}")
    return key.strip(), value


#: ``outcore.plan``'s keywords that the CLI sets itself, so ``--option`` cannot pass them:
#: name -> what to use instead (``--option host_budget=64GiB`` does reach ``outcore.plan``).
PLAN_ARGUMENTS = {
    "budget": "use --budget", "policy": "use --policy", "gpu": "use --gpu",
    "cache": "use --no-cache to skip the plan cache (SuperNeurons' LRU tensor cache is "
             "--option tensor_cache=false)",
    "cost": "use --cost", "recapture": "set by the command", "bound": "set by the command",
}


def _model_arguments(p: argparse.ArgumentParser, *, default_fake: bool) -> None:
    p.add_argument("--model", default=None,
                   help="a zoo name (see `outcore models`) or module:function returning "
                        "(model, loss_fn, (x, y)); module:function RUNS that code")
    p.add_argument("--batch", type=int, default=32, help="mini-batch size (zoo models)")
    p.add_argument("--small", action="store_true",
                   help="zoo: the reduced-width version of the network (fits this CPU)")
    if default_fake:
        p.add_argument("--real", action="store_true",
                       help="capture real tensors (default: fake, sizes only)")
    p.add_argument("--list-models", action="store_true", help="list the zoo and exit")
    p.add_argument("--list-gpus", action="store_true", help="list the GPU profiles and exit")
    p.add_argument("--list-policies", action="store_true", help="list the policies and exit")


def _planning_arguments(p: argparse.ArgumentParser, *, cost: bool = True) -> None:
    """--budget, --gpu, --policy, --option, --allow-sub-batches and (``cost``) --cost."""
    p.add_argument("--budget", default=None,
                   help='device memory budget with a unit, e.g. "12GB", "11.5GiB"')
    p.add_argument("--gpu", default=None, help="hardware profile (default v100-pcie; "
                   "see `outcore gpus`)")
    p.add_argument("--policy", default="auto", help="policy name (see `outcore policies`)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a policy option (repeatable); values are read as int, float, "
                        "true/false or text, e.g. --option portfolio=false")
    p.add_argument("--allow-sub-batches", action="store_true",
                   help="let the plan split the batch into sub-batches (changes what "
                        "BatchNorm computes; announced)")
    if not cost:  # `outcore run`: the Trainer plans with the --gpu profile's costs
        return
    p.add_argument("--cost", default=None, metavar="PATH",
                   help="plan with an op profile written by `outcore profile --model M --out "
                        "PATH` instead of the GPU profile")


def _scope_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scope", default="step", choices=("step", "activations"),
                   help="what --budget bounds: the whole step (default) or the activations "
                        "only, parameters, buffers, inputs and the parameters' gradients "
                        "left out (as torch's activation_memory_budget)")


def _weights_arguments(p: argparse.ArgumentParser, *, run: bool = False) -> None:
    """--optimizer and its options: plan, explain (the weights planned) and run (trained
    under that plan; ``run``: its help and --lr)."""
    p.add_argument("--optimizer", default=None, choices=OPTIMIZERS, help=(
        "train with this torch optimizer under the plan `outcore plan --optimizer` makes: "
        "the budget holds the parameters, gradients and optimizer state with the "
        "activations, and parameters it cannot hold live in host memory, stepped there "
        "(needs --budget; policy auto or outcore-checkpoint); --json reports the plan's "
        "memory under plan --json's keys: device_state, host_bytes = host_copies + "
        "host_state, pinned. Default: SGD, only the activations planned") if run else (
        "plan the parameters, gradients and this torch optimizer's state (with --momentum "
        "and --weight-decay, as `outcore run` builds it: on the model's own parameters, so "
        "its state is in their dtype and a bf16/fp16 model gets no fp32 master copies unless "
        "--master-weights) with "
        "the activations (the budget then holds them all): which live in host memory, host "
        "and pinned bytes (--json: weights.host_bytes = host_copies, the step's host copies, "
        "+ host_state, the host-held optimizer state), the step with the optimizer step"))
    p.add_argument("--master-weights", action="store_true", help=(
        "with --optimizer, for a bf16/fp16 model: fp32 master copies of its parameters in "
        "host memory, the optimizer built on them (its state fp32 too) and each step taken "
        "in fp32 on the host, the model's weights rewritten as the masters' cast "
        "(outcore.weights.mixed.MasterWeights); the plan counts the masters and their state as "
        "host memory (host_state). Refused for a model with an fp32 parameter"))
    p.add_argument("--weights", default=None, choices=("auto", "device", "host"),
                   help="with --optimizer: where the parameters live (default auto: in host "
                        "memory when that makes the step fastest or the budget needs it)")
    p.add_argument("--host-adam-rate", type=float, default=None, metavar="PARAMS_PER_S",
                   help="with --optimizer: this CPU's AdamW parameters per second (SGD and "
                        "the others are priced from it by the bytes their step moves per "
                        "parameter: SGD without momentum 12 to AdamW's 28)")
    if run:
        p.add_argument("--lr", type=float, default=None,
                       help="learning rate (default 0.01 with SGD, 1e-3 with Adam and AdamW)")
    p.add_argument("--momentum", type=float, default=None,
                   help="SGD's momentum (default 0: SGD keeps no state; above 0 one momentum "
                        "buffer per parameter, which the plan counts)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="the optimizer's weight decay (default torch's: 0, 0.01 for AdamW)")


def _global_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of tables (accepted anywhere)")
    p.add_argument("--no-cache", action="store_true",
                   help="plan (and capture) again even when the plan cache holds the result")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")


def _gpus_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=1, help="data parallel: simulate N GPUs, each "
                   "with its share of --batch (budget per GPU)")
    p.add_argument("--host", default=None, help="multi-GPU host profile for --gpus (default "
                   "the GPU's; e.g. v100-pcie-x8, dgx1-v100, k40m-x2)")


def build_parser() -> argparse.ArgumentParser:
    from outcore import __version__

    parser = argparse.ArgumentParser(prog="outcore", description=(
        "Train networks whose training memory exceeds the accelerator's: plan, simulate "
        "and run keep/offload/recompute schedules."),
        epilog="Exit codes: 0 ok, 1 unexpected error, 2 bad arguments, 3 budget cannot be "
               "met, 4 device out of memory, 5 capture failed, 6 output not written, 141 "
               "stdout closed by its reader.")
    parser.add_argument("--version", action="version", version=f"outcore {__version__}")
    _global_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for build in COMMAND_BUILDERS:
        build(sub)
    return parser


def _add_planning_commands(sub: Any) -> None:
    p = sub.add_parser("plan", help="plan a model under a budget: decisions, peak, time")
    _model_arguments(p, default_fake=True)
    _planning_arguments(p)
    _scope_argument(p)
    _weights_arguments(p)
    _gpus_arguments(p)

    p = sub.add_parser("simulate", help="simulate a plan on a GPU profile; write plot, trace, HTML")
    _model_arguments(p, default_fake=True)
    _planning_arguments(p)
    _scope_argument(p)
    p.add_argument("--out", default="out", help="folder for memory.png, trace.json, "
                   "report.html and memory_snapshot.pickle (created; nothing written outside)")

    p = sub.add_parser("run", help="train N steps on the CPU-emulated device")
    _model_arguments(p, default_fake=False)
    _planning_arguments(p, cost=False)
    p.add_argument("--steps", type=int, default=3, help="training steps to run")
    _weights_arguments(p, run=True)
    p.add_argument("--nproc", type=int, default=1, help="data-parallel ranks on this machine "
                   "(started under torchrun, gloo, each with its share of --batch)")

    p = sub.add_parser("compare", help="every policy side by side at one budget")
    _model_arguments(p, default_fake=True)
    _planning_arguments(p)
    _gpus_arguments(p)

    p = sub.add_parser("explain", help="per tensor: what was decided and why")
    _model_arguments(p, default_fake=True)
    _planning_arguments(p)
    _weights_arguments(p)
    p.add_argument("--limit", type=int, default=40, help="rows to show (0 = all)")


def _add_other_commands(sub: Any) -> None:
    from outcore.reproduce import PAPERS

    p = sub.add_parser("reproduce", help="run a paper's reproduction benchmark")
    p.add_argument("paper", help=", ".join(PAPERS))
    p.add_argument("--quick", action="store_true", help="a smaller, faster run")

    p = sub.add_parser("profile", help="measure this machine (and optionally a model's ops)")
    p.add_argument("--list", action="store_true", help="list the GPU profiles instead")
    p.add_argument("--model", default=None, help="also time every op of this zoo model")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--small", action="store_true")
    p.add_argument("--out", default=None, help="write the op profile JSON here (read it back "
                   "with `outcore plan --cost PATH`)")

    sub.add_parser("models", help="list the zoo's networks")
    sub.add_parser("gpus", help="list the GPU profiles")
    sub.add_parser("policies", help="list the policies, with their papers")


#: Functions that add subcommands to the parser (other modules may append theirs).
COMMAND_BUILDERS: list[Callable[[Any], None]] = [_add_planning_commands, _add_other_commands]


def _hoist_global_flags(argv: Sequence[str]) -> list[str]:
    """Move --json/--no-cache/--debug to the front, wherever they were given (before "--")."""
    args = list(argv)
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in GLOBAL_FLAGS]
    rest = [a for a in args[:end] if a not in GLOBAL_FLAGS]
    return flags + rest + args[end:]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``outcore`` command; returns the exit code. A reader that closed
    stdout early (``outcore --json plan ... | head -1``) ends it quietly with
    ``EXIT_PIPE``: no traceback, nothing more written to stdout."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe could not be caught
        return code
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """stdout's reader went away: point stdout at the null device (what Python flushes at
    exit then goes nowhere, instead of failing again) and return ``EXIT_PIPE``."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (captured, in-process)
        return EXIT_PIPE
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return EXIT_PIPE


def _run(argv: Sequence[str] | None) -> int:
    """``main`` less its closed-pipe handling."""
    parser = build_parser()
    try:
        args = parser.parse_args(_hoist_global_flags(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse already printed a one-line usage error or --help
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    from outcore import cli_commands, progress

    args.argv = list(argv) if argv is not None else sys.argv[1:]  # run --nproc re-launches
    progress.configure(not args.json)
    handler = cli_commands.handler(args)
    with _cli_logging(args):
        try:
            result = handler(args)
        except (OutcoreError, KeyboardInterrupt) as exc:
            if args.debug:
                raise
            _fail(args, exc)
            return _exit_code(exc)
        except BrokenPipeError:  # the reader went away: not an error of outcore's
            raise
        except Exception as exc:
            if args.debug:
                raise
            _fail(args, exc)
            print("outcore: this is a bug in outcore or in the model; run again with --debug "
                  "for the traceback", file=sys.stderr)
            return EXIT_ERROR
        finally:
            progress.configure(False)
    if args.json and result is not None:
        print(json.dumps(result, indent=2, default=str))
    return EXIT_OK


@contextlib.contextmanager
def _cli_logging(args: argparse.Namespace) -> Iterator[None]:
    """Print the ``outcore`` logger's warnings on stderr (one line each; with --debug its
    info lines too); outcore's own warnings are shown through it, not twice."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("outcore: %(levelname)s: %(message)s"))
    handler.setLevel(logging.INFO if args.debug else logging.WARNING)
    logger = logging.getLogger("outcore")
    level = logger.level
    logger.setLevel(handler.level if level == logging.NOTSET else min(level, handler.level))
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OutcoreWarning)
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _fail(args: argparse.Namespace, exc: BaseException) -> None:
    message = str(exc).strip("'\"") or "interrupted"
    if args.json:
        print(json.dumps({"error": type(exc).__name__, "message": message,
                          "exit_code": _exit_code(exc)}))
    else:
        print(f"outcore {args.command}: {type(exc).__name__}: {message}", file=sys.stderr)


def emit(args: argparse.Namespace, render: Any) -> None:
    """Call ``render(console)`` unless --json is set. No emoji codes: a label such as
    ``mymodule:llama`` is the user's text, not ``:llama:``. A closed stdout raises
    BrokenPipeError (``main`` ends quietly with ``EXIT_PIPE``)."""
    if args.json:
        return
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            """rich's own answer is ``SystemExit(1)``: leave it to ``main`` instead."""
            self.quiet = True
            raise BrokenPipeError("stdout was closed by its reader")

    render(PipeConsole(emoji=False))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
