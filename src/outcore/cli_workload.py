"""What the planning commands share: checking the arguments before any capture, loading the
workload, capturing it (through the on-disk cache for zoo models) and planning it.

``check(args)`` runs first, in well under a second: policy and options, GPU, budget, model
name, batch. Only then does ``planned(args)`` capture (seconds to a minute at paper scale).

``--model module:function`` imports ``module`` and calls ``function()``: that runs the
user's code (as ``uvicorn module:app`` does), so it is loaded only after every other
argument was checked, and its graphs are never cached (the code may change between runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from outcore import progress
from outcore.cli import OPTIMIZERS, UsageError, parse_option
from outcore.errors import CaptureError, UnknownModelError


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--option key=value`` pairs as a dict (a repeated key: the last wins), without
    ``allow_sub_batches`` (see ``allow_sub_batches``)."""
    found = dict(parse_option(text) for text in getattr(args, "option", []) or [])
    found.pop("allow_sub_batches", None)
    return found


def allow_sub_batches(args: argparse.Namespace) -> bool | None:
    """True with ``--allow-sub-batches`` (or ``--option allow_sub_batches=true``), else None
    (the API's default: only policy modnn splits)."""
    given = dict(parse_option(text) for text in getattr(args, "option", []) or [])
    return True if getattr(args, "allow_sub_batches", False) or \
        given.get("allow_sub_batches") is True else None


def check(args: argparse.Namespace) -> None:
    """Every argument of a planning command, before anything is captured."""
    from outcore.validation import (
        check_budget,
        check_gpu,
        check_model,
        check_policy,
        check_positive_int,
    )

    if args.model is None:
        raise UsageError(f"outcore {args.command} needs --model NAME (a zoo name, see "
                         "`outcore models`, or module:function)")
    if hasattr(args, "policy"):
        check_policy(args.policy, options(args))
        args.gpu = check_gpu(args.gpu)
        check_budget(args.budget)
    check_model(args.model)
    check_positive_int(args.batch, "--batch")
    if hasattr(args, "steps"):
        check_positive_int(args.steps, "--steps")
    if hasattr(args, "momentum"):
        check_optimizer_options(args)
    if getattr(args, "cost", None):
        from pathlib import Path

        if not Path(args.cost).is_file():
            raise UsageError(f"--cost {args.cost!r}: no such file; write one with `outcore "
                             "profile --model M --out PATH`")


#: ``outcore run``: the torch optimizer of each --optimizer and its --lr when not given
RUN_OPTIMIZERS = {"sgd": ("SGD", 0.01), "adam": ("Adam", 1e-3), "adamw": ("AdamW", 1e-3)}
#: what ``outcore run --optimizer`` plans with (``outcore.compile(..., optimizer=)``)
WEIGHTS_POLICIES = ("auto", "outcore-auto", "outcore-checkpoint")


def check_optimizer_options(args: argparse.Namespace) -> None:
    """--optimizer's options (plan, explain, run), before anything is captured: finite
    --lr and --host-adam-rate (> 0), --momentum and --weight-decay (>= 0); --momentum for
    SGD only; --weights and --host-adam-rate only with --optimizer, and on plan and
    explain (which plan nothing with them otherwise) --momentum and --weight-decay too."""
    import math

    from outcore.errors import InvalidOptionError

    for flag, value, low in (("--lr", getattr(args, "lr", None), 0.0),
                             ("--host-adam-rate", args.host_adam_rate, 0.0),
                             ("--momentum", args.momentum, None),
                             ("--weight-decay", args.weight_decay, None)):
        if value is not None and not (math.isfinite(value) and (
                value > low if low is not None else value >= 0)):
            raise InvalidOptionError(f"{flag}={value!r}", "a finite number above 0"
                                     if low is not None else "a finite number of at least 0")
    if args.momentum is not None and args.optimizer not in (None, "sgd"):
        raise UsageError(f"--momentum is SGD's; --optimizer {args.optimizer} has none (its "
                         "betas are torch's defaults)")
    if args.optimizer is not None:
        return
    flags = ["master_weights", "weights", "host_adam_rate"] + (
        [] if args.command == "run" else ["momentum", "weight_decay"])
    given = [f"--{f.replace('_', '-')}" for f in flags
             if getattr(args, f, None) not in (None, False)]
    if given:
        raise UsageError(f"{given[0]} goes with --optimizer (outcore {args.command} "
                         f"--optimizer {'|'.join(OPTIMIZERS)} ...)")


def check_training(args: argparse.Namespace) -> None:
    """``outcore run --optimizer`` (the weights planned), before anything is captured: a
    budget, one process, the policies and none of the options the weights plan does not
    take (the optimizer's own options: ``check_optimizer_options``)."""
    if args.optimizer is None:
        return
    refused = ""
    if args.budget is None:
        refused = "needs --budget (the plan decides what the budget cannot hold of the weights)"
    elif args.nproc > 1:
        refused = ("runs one process (the weights are not planned with data parallel yet): "
                   "leave out --nproc, or --optimizer to plan only the activations")
    elif args.policy not in WEIGHTS_POLICIES:
        refused = (f"plans with policy auto or outcore-checkpoint, not {args.policy!r} (as "
                   "`outcore plan --optimizer` does)")
    elif options(args):
        refused = "takes no --option (the weights plan has none)"
    elif allow_sub_batches(args):
        refused = "does not split the batch: leave out --allow-sub-batches"
    if refused:
        raise UsageError(f"outcore run --optimizer {args.optimizer} {refused}")


def optimizer_options(args: argparse.Namespace) -> dict[str, Any]:
    """--momentum and --weight-decay as the torch optimizer's keyword arguments (those
    given; torch's defaults for the rest): what ``outcore run`` builds the optimizer with
    and ``outcore plan`` sizes its state from."""
    found = {"momentum": args.momentum, "weight_decay": args.weight_decay}
    return {k: v for k, v in found.items() if v is not None}


def optimizer_for(args: argparse.Namespace, params: Any) -> Any:
    """The torch optimizer of ``outcore run`` on ``params``: --optimizer (SGD when not
    given) with --lr, --momentum and --weight-decay, torch's defaults for the rest."""
    import torch

    name, default_lr = RUN_OPTIMIZERS[args.optimizer or "sgd"]
    lr = getattr(args, "lr", None)  # plan and explain have no --lr (it keeps no state)
    kwargs: dict[str, Any] = {"lr": default_lr if lr is None else lr}
    return getattr(torch.optim, name)(params, **kwargs, **optimizer_options(args))


def optimizer_spec(args: argparse.Namespace) -> Any:
    """What ``outcore plan --optimizer`` sizes the state of: the torch optimizer ``outcore
    run`` builds from the same flags (``optimizer_for``, here on a one-element probe
    parameter: its options, not its parameters, decide what it keeps per element), sized
    as ``outcore run`` sizes it (``outcore.weights.spec.spec_of``: ``STATE``'s account, SGD
    without --momentum keeping nothing). ``outcore run`` builds it on the model's own
    parameters, so its state is in their dtype (bf16 moments for a bf16 model) and there
    are no fp32 master copies; this plan counts the same bytes. With ``--master-weights``
    it builds it on fp32 masters (``MasterWeights``): the spec's mixed-precision recipe,
    fp32 state plus the master per bf16/fp16 parameter, in host memory (``graph_masters``),
    as ``outcore.weights.optimizer.state_bytes`` sizes the run's."""
    import torch

    from outcore.weights.spec import spec_of

    probe = torch.nn.Parameter(torch.zeros(1))
    spec = spec_of(optimizer_for(args, [probe]))
    if getattr(args, "master_weights", False):  # built on fp32 masters: fp32 state + master
        return dataclasses.replace(spec, master=True, own_dtype=False)
    return spec


def check_masters(dtypes: Mapping[str, str]) -> None:
    """``--master-weights``: refused (UsageError) unless every parameter (name -> dtype
    name, as the graph spells it: "bfloat16") is narrower than fp32. An fp32 parameter
    needs no master, and a master of one would be counted by ``outcore run`` (which masters
    every parameter, ``MasterWeights``) but not by ``outcore plan`` (which counts masters of
    the narrower ones, ``OptimizerSpec.mastered``)."""
    wide = [(name, dtype) for name, dtype in dtypes.items()
            if dtype not in ("bfloat16", "float16")]
    if not wide:
        return
    name, dtype = wide[0]
    whole = "the model's parameters are" if len(wide) == len(dtypes) else \
        f"{len(wide)} of the model's {len(dtypes)} parameters are not bf16/fp16, e.g. {name!r} is"
    raise UsageError(
        f"--master-weights keeps fp32 master copies of a bf16/fp16 model's parameters, and "
        f"{whole} {dtype}: "
        + ("an fp32 model needs no masters, leave out --master-weights"
           if len(wide) == len(dtypes) else
           "cast the whole model (model.to(torch.bfloat16)) or leave out --master-weights"))


def budget(args: argparse.Namespace) -> int | None:
    """The checked budget in bytes (the unit note was given by ``check``)."""
    from outcore.validation import check_budget

    return check_budget(args.budget, warn_unitless=False)


def load_workload(args: argparse.Namespace, *, fake: bool,
                  batch: int | None = None) -> tuple[Any, Any, Any, str]:
    """(model, loss_fn, batch, label) from ``--model`` (zoo name or module:function)."""
    spec = args.model
    size = args.batch if batch is None else batch
    if ":" in spec:
        module_name, _, func_name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise UnknownModelError(spec, "module:function naming a function of an importable "
                                    "module", f"Cannot load it ({type(exc).__name__}: {exc}); "
                                    "check the module is on PYTHONPATH.") from None
        try:
            made = fn()
        except Exception as exc:  # the user's own code: say so, not "a bug in outcore"
            raise UsageError(f"{spec}() raised {type(exc).__name__}: {exc} (that error is in "
                             "the function itself; run it in Python, or pass --debug for the "
                             "traceback)") from exc
        if hasattr(made, "model"):
            return made.model, made.loss_fn, made.batch, spec
        if not (isinstance(made, tuple) and len(made) == 3):
            raise UsageError(f"{spec} must return (model, loss_fn, (x, y)) or a zoo Workload")
        return made[0], made[1], made[2], spec
    from outcore import zoo

    w = zoo.get(spec, size, fake=fake, small=getattr(args, "small", False))
    return w.model, w.loss_fn, w.batch, f"{spec} (batch {size})"


def capture(args: argparse.Namespace, *, fake: bool) -> tuple[Any, str]:
    """The step graph of ``--model`` and its label; zoo graphs come from the cache when it
    holds them (``--no-cache`` captures again)."""
    from outcore import plan_cache
    from outcore.graph.ir import Graph

    zoo_model = ":" not in args.model
    label = f"{args.model} (batch {args.batch})" if zoo_model else args.model
    key = None
    if zoo_model and plan_cache.enabled(False if args.no_cache else None):
        key = plan_cache.graph_key(model=args.model, batch=args.batch, fake=fake,
                                   small=getattr(args, "small", False))
        text = plan_cache.load(key)
        if isinstance(text, str):
            return Graph.from_json(text), label
    from outcore.capture import capture as run_capture

    model, loss_fn, batch, label = load_workload(args, fake=fake)
    try:
        with progress.task(f"capturing {label}{' (fake tensors)' if fake else ''}"):
            graph = run_capture(model, loss_fn, batch, fake=fake, name=args.model)
    except CaptureError as exc:
        if fake and "with fake=True it cannot" in str(exc):  # the CLI's spelling of fake=False
            raise CaptureError(f"{exc} On the command line: pass --real to capture with the "
                               "example's values.") from exc
        raise
    if key is not None:
        plan_cache.store(key, graph.to_json())
    return graph, label


def recapture_for(args: argparse.Namespace, *, fake: bool) -> Any:
    """``parts -> Graph`` at batch / parts. Policies only get it with
    ``--allow-sub-batches`` (or ``--policy modnn``); otherwise it lets the refusal of a
    budget that only sub-batches could meet say so."""

    def recapture(parts: int) -> Any:
        from outcore.capture import capture as run_capture
        from outcore.runtime.subbatch import split_batch

        if ":" not in args.model:
            model, loss_fn, batch, label = load_workload(args, fake=fake,
                                                         batch=args.batch // parts)
        else:
            model, loss_fn, full, label = load_workload(args, fake=fake)
            batch = split_batch(tuple(full), parts)[0]
        with progress.task(f"capturing {label} at 1/{parts} of the batch"):
            return run_capture(model, loss_fn, batch, fake=fake, name=args.model)

    return recapture


def cost_model(args: argparse.Namespace) -> Any:
    """The op profile of ``--cost``, or None (the GPU profile's analytic model)."""
    if not getattr(args, "cost", None):
        return None
    from outcore.cost.measured import MeasuredProfile

    return MeasuredProfile.load(args.cost)


def plan_policy(args: argparse.Namespace, graph: Any, policy: str, *,
                bound: bool = False) -> Any:
    """Plan ``graph`` with ``policy`` and the command's budget, GPU, options and cache;
    ``bound``: also the lower bound on any plan's step time (``plan(bound=True)``)."""
    from outcore.api import plan

    fake = not getattr(args, "real", False)
    if getattr(args, "master_weights", False):
        from outcore.plan.weights import parameters

        check_masters({name: graph.tensors[tid].dtype
                       for name, tid in parameters(graph).items()})
    weights = {k: getattr(args, k) for k in ("weights", "host_adam_rate")
               if getattr(args, k, None) is not None}
    if getattr(args, "optimizer", None) is not None:
        weights["optimizer"] = optimizer_spec(args)
    return plan(graph, budget(args), policy=policy, gpu=args.gpu, cost=cost_model(args),
                recapture=recapture_for(args, fake=fake),
                allow_sub_batches=allow_sub_batches(args),
                cache=False if args.no_cache else None, bound=bound, **weights,
                scope=getattr(args, "scope", "step"), **options(args))


def planned(args: argparse.Namespace) -> tuple[Any, str]:
    """Check, capture and plan: the PlannedStep of the command's arguments and its label."""
    check(args)
    graph, label = capture(args, fake=not getattr(args, "real", False))
    return plan_policy(args, graph, args.policy, bound=True), label
