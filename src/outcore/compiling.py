"""``outcore.compile``: every argument checked, then the trainer it asks for built.

One entry point, four trainers: ``outcore.trainer.Trainer`` (one process, the activations
planned), ``outcore.distributed``'s data-parallel trainer (``distributed=``) and
``outcore.weights``' trainer (``optimizer=``: the weights planned too). Nothing is captured
before the arguments are checked (``outcore.validation``), and a device made for a trainer
whose construction fails is closed again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from outcore.capture.aot import autocast_state
from outcore.capture.batching import LossFn
from outcore.errors import InvalidArgumentError
from outcore.planned import MACHINE
from outcore.trainer import DEFAULT_CACHE_SIZE, Trainer, _close

#: ``outcore.weights.compile``'s own keyword arguments, taken by ``compile(optimizer=...)``
WEIGHTS_OPTIONS = ("clip_grad_norm", "master", "slowdown", "bandwidth", "profile",
                   "device_options")


def compile(model: nn.Module, loss_fn: LossFn, example_batch: Any, *,
            budget: int | str | None = "6GiB", device: str = "cuda", gpu: str | None = None,
            policy: str = "auto", autocast: torch.dtype | None = None,
            cache_size: int = DEFAULT_CACHE_SIZE, allow_sub_batches: bool | None = None,
            cache: bool | None = None, host_budget: int | str | None = MACHINE,
            distributed: Any = False, optimizer: Any = None, transfer_plans: bool = False,
            outputs: bool = False, **options: Any) -> Any:
    """Capture, plan and prepare ``model`` to train within ``budget`` on ``device``.

    Every argument is checked before the capture (``InvalidArgumentError`` subclasses).

    Args:
        model, loss_fn, example_batch: as for ``outcore.capture``: ``loss_fn(model(x), y)``;
            a dict batch (``model(**batch)``); or ``loss_fn=None`` for a model returning its
            own loss (a Hugging Face model given ``labels``).
        budget: device memory to stay within (bytes or "12GB"/"11.5GiB"); None = unbounded.
        device: "cuda", "cpu-emulated" (the accelerator emulated on this CPU, with the
            budget as its capacity and a copy engine per direction) or "cpu".
        gpu: hardware profile for planning and, on "cpu-emulated", for the link bandwidth;
            default: the GPU that is there on "cuda" (``outcore.hardware.default_gpu``).
        policy: a name from ``outcore.policies()``; "auto" = outcore-auto.
        autocast: torch.bfloat16 or torch.float16 to train under ``torch.autocast``; by
            default the autocast in effect at this call (``with torch.autocast(...)``).
        cache_size: how many planned signatures (batch shapes, dtypes, frozen parameters)
            the Trainer keeps; a new one is captured and planned on its first step.
        transfer_plans: True: a new batch shape (another sequence length) whose graph has
            the structure of a cached one runs that one's plan when it fits the budget there
            and simulates nearly as well, instead of a new search (``outcore.plan_transfer``;
            gradients unchanged, said in ``stats.notes``); the shape is planned for its own
            sizes after ``PROMOTE_AFTER`` steps. Worth it where a search costs far more than
            a capture (large graphs); off by default (every new shape is searched). Not
            with ``distributed`` (each rank plans its shares).
        outputs: True: after each ``step`` (and each evaluation under ``torch.no_grad()``)
            ``trainer.outputs`` holds what the model returned (detached: logits for a
            metric, a Hugging Face ``ModelOutput``), as eager's forward returns it. The step
            keeps copies of them to its end and the plan counts them (a large output, an
            LM's logits, costs its bytes in the budget). Under sub-batches
            (``allow_sub_batches``, modnn) each sub-batch's wait in host memory and the
            whole batch's are assembled along the batch dimension (a copy of the model's
            own loss is the step's loss; an output reduced over the batch is None); they
            are handed over on the device when they fit beside the step's end within the
            plan's peak, else in host memory, said in a warning and ``stats.notes``. With
            ``optimizer`` too (the weights trainer's ``outputs``, after ``step`` and
            ``train_step``), and with ``distributed`` (each rank's outputs of its share, as
            DDP's forward returns the local output).
        allow_sub_batches: let the plan split the batch (changes BatchNorm statistics; off
            unless True or policy="modnn"); announced and shown in ``stats.notes``.
        cache: reuse a plan from the on-disk cache (see ``outcore.plan``).
        host_budget: host bytes the host copies may hold (default: what this machine or its
            cgroup allows; see ``plan``). On "cuda" the pinned host pool is reserved for the
            plan's host copies at once and never grows past this budget.
        distributed: data parallel (``outcore.distributed``): True (the default process
            group, initialised from torchrun's environment if needed) or a
            ``torch.distributed`` ProcessGroup. ``example_batch`` is then this rank's share
            as ``(x, y)``; gradients are averaged over the ranks. Extra options:
            ``bucket_cap`` (bytes), ``timeout`` (a timedelta), ``host`` (a multi-GPU host
            profile).
        optimizer: the user's ``torch.optim`` optimizer (built on ``model.parameters()``):
            the budget then holds the parameters, gradients and optimizer state too, and
            the plan decides which parameters live in host memory with the activations
            (``outcore.weights.compile``; a ``WeightTrainer``: ``step`` accumulates
            ``.grad``, the user still calls ``optimizer.step()``). Runs on
            "cpu-emulated" and "cpu"; policy "auto" or "outcore-checkpoint". Its own
            options pass through (``WEIGHTS_OPTIONS``: ``clip_grad_norm`` for
            ``train_step``, ``master`` weights, ...).

    Returns:
        A Trainer; ``trainer.step(x, y)`` or ``trainer.step(batch)`` trains one step (a
        ``DataParallelTrainer`` with ``distributed``).
    """
    from outcore.runtime.devices import make_device
    from outcore.validation import check_budget, check_device, check_gpu, check_policy

    limit = check_budget(budget)
    check_device(device)
    gpu = check_gpu(gpu)
    dp_options: tuple[str, ...] = (("bucket_cap", "timeout", "host")
                                   if distributed not in (False, None) else ())
    if optimizer is not None:
        dp_options += WEIGHTS_OPTIONS
    check_policy(policy, {k: v for k, v in options.items() if k not in dp_options})
    if optimizer is not None:  # first: it refuses distributed= (not planned together yet)
        return _compile_weights(model, loss_fn, example_batch, optimizer, limit, device, gpu,
                                policy, distributed, options, outputs)
    if distributed is not False and distributed is not None:
        from outcore.distributed import compile_data_parallel

        # every argument reaches the rank: allow_sub_batches, cache and host_budget its plans
        # and re-plans, autocast its capture, cache_size the shapes it keeps (they were
        # dropped here: the refusal's advice "pass allow_sub_batches=False" changed nothing
        # under modnn, autocast=torch.bfloat16 trained in float32)
        return compile_data_parallel(model, loss_fn, example_batch, distributed=distributed,
                                     budget=budget, device=device, gpu=gpu, policy=policy,
                                     autocast=autocast, cache_size=cache_size,
                                     allow_sub_batches=allow_sub_batches, cache=cache,
                                     host_budget=host_budget, outputs=outputs, **options)
    if autocast is None:
        autocast_now = autocast_state(None, example_batch, model)
        autocast = autocast_now[1] if autocast_now is not None else None
    trainer_device = make_device(device, capacity=limit,
                                 gpu=gpu if device == "cpu-emulated" else None)
    try:
        return Trainer(model, loss_fn, example_batch, device=trainer_device, budget=limit,
                       policy=policy, gpu=gpu, autocast=autocast, cache_size=cache_size,
                       options=options, allow_sub_batches=allow_sub_batches, cache=cache,
                       host_budget=host_budget, device_kind=device,
                       transfer_plans=transfer_plans, keep_outputs=outputs)
    except BaseException:
        _close(trainer_device)
        raise


def _compile_weights(model: nn.Module, loss_fn: LossFn, example_batch: Any, optimizer: Any,
                     limit: int | None, device: str, gpu: str | None, policy: str,
                     distributed: Any, options: dict[str, Any], outputs: bool = False) -> Any:
    """``compile(..., optimizer=...)``: ``outcore.weights.compile`` (checked first)."""
    from outcore.weights import compile as compile_weights

    if limit is None:
        raise InvalidArgumentError(None, "a budget with optimizer=", "The plan decides what "
                                   "the budget cannot hold of the weights; give budget=.")
    extra = {k: options.pop(k) for k in WEIGHTS_OPTIONS if k in options}
    if distributed not in (False, None):
        raise InvalidArgumentError("distributed", "optimizer= without distributed=", "The "
                                   "weights are planned for one process for now: drop "
                                   "optimizer= for data parallel (the budget then holds the "
                                   "step's activations, gradients and parameters), or run "
                                   "one process.")
    if options or policy not in (
            "auto", "outcore-auto", "outcore-checkpoint"):
        raise InvalidArgumentError(policy, "policy='auto' without other options or "
                                   "distributed= when an optimizer is given", "The weights "
                                   "are planned with outcore-auto for one process for now.")
    return compile_weights(model, loss_fn, example_batch, optimizer=optimizer, budget=limit,
                           device=device, gpu=gpu, outputs=outputs, **extra)
