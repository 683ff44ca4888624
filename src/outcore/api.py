"""The user-facing Python API: plan a captured step, or compile a model into a trainer.

    >>> import torch, outcore
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    >>> batch = (torch.randn(4, 8), torch.tensor([0, 1, 1, 0]))
    >>> trainer = outcore.compile(net, torch.nn.functional.cross_entropy, batch,
    ...                           budget="64KiB", device="cpu")
    >>> loss = trainer.step(*batch)          # gradients are now in net's .grad
    >>> trainer.stats.measured_peak <= trainer.budget
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from outcore.capture.aot import capture
from outcore.graph.ir import Graph
from outcore.plan.plan import Plan
from outcore.planned import (
    DEFAULT_GPU,
    DEFAULT_POLICY,
    MACHINE,
    PlannedStep,
    cost_model_for,
    plan,
    policies,
)
from outcore.units import format_bytes

__all__ = ["DEFAULT_GPU", "DEFAULT_POLICY", "PlannedStep", "Trainer", "TrainerStats", "compile",
           "cost_model_for", "plan", "policies"]


@dataclass
class TrainerStats:
    """What the last ``step`` measured, beside what the plan predicted."""

    predicted_peak: int = 0
    measured_peak: int = 0
    step_seconds: float = 0.0
    steps: int = 0
    sub_batches: int = 1
    history: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what changed semantics (sub-batches)

    def __str__(self) -> str:
        text = (f"peak {format_bytes(self.measured_peak)} measured vs "
                f"{format_bytes(self.predicted_peak)} predicted; "
                f"step {self.step_seconds * 1e3:.1f} ms")
        if self.sub_batches > 1:
            text += f"; {self.sub_batches} sub-batches (opted in)"
        return text


class Trainer:
    """Runs planned training steps; build it with ``outcore.compile``.

    ``step(x, y)`` runs forward and backward and accumulates gradients into the model's
    ``.grad`` (call ``optimizer.zero_grad()`` between steps, as with ``loss.backward()``).
    """

    def __init__(self, model: nn.Module, planned: PlannedStep, device: Any,
                 budget: int | None) -> None:
        from outcore.runtime.executor import Executor

        self.model = model
        self.planned = planned
        self.device = device
        self.budget = budget
        self.executor = Executor(planned.graph, planned.schedule, device)
        self.stats = TrainerStats(predicted_peak=planned.predicted_peak,
                                  sub_batches=planned.plan.sub_batches,
                                  notes=list(planned.notes))

    @property
    def plan(self) -> Plan:
        return self.planned.plan

    def explain(self) -> list[dict[str, Any]]:
        """Per activation, what was decided and why (see ``PlannedStep.explain``)."""
        return self.planned.explain()

    def step(self, x: Any, y: Any) -> torch.Tensor:
        """One training step on ``(x, y)``; returns the loss (a detached scalar).

        Raises BatchMismatchError (a ValueError) before running anything when the batch's
        shapes or dtypes differ from the captured example's.
        """
        from outcore.batch_check import check_batch
        from outcore.runtime.subbatch import run_sub_batches

        parts = self.planned.plan.sub_batches
        check_batch(self.planned.graph, (x, y), parts)
        if parts > 1:
            result = run_sub_batches(self.executor, (x, y), parts)
        else:
            result = self.executor.run((x, y))
        self.stats.measured_peak = result.peak_bytes
        self.stats.step_seconds = result.seconds
        self.stats.steps += 1
        self.stats.history.append(float(result.loss))
        return result.loss

    def close(self) -> None:
        """Stop the device's copy engines (if any); idempotent. A trainer that is never
        closed stops them when it is garbage-collected or the interpreter exits."""
        closer = getattr(self.device, "close", None)
        if closer is not None:
            closer()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def compile(model: nn.Module, loss_fn: Callable[..., torch.Tensor], example_batch: Any, *,
            budget: int | str | None = "6GiB", device: str = "cuda", gpu: str | None = None,
            policy: str = "auto", allow_sub_batches: bool | None = None,
            cache: bool | None = None, host_budget: int | str | None = MACHINE,
            distributed: Any = False, **options: Any) -> Trainer:
    """Capture, plan and prepare ``model`` to train within ``budget`` on ``device``.

    Args:
        model, loss_fn, example_batch: as for ``outcore.capture``: ``loss_fn(model(x), y)``.
        budget: device memory to stay within (bytes or "12GB"/"11.5GiB"); None = unbounded.
        device: "cuda", "cpu-emulated" (the accelerator emulated on this CPU, with the
            budget as its capacity and a copy engine per direction) or "cpu".
        gpu: hardware profile for planning and, on "cpu-emulated", for the link bandwidth;
            default: the GPU that is there on "cuda" (``outcore.hardware.default_gpu``).
        policy: a name from ``outcore.policies()``; "auto" = outcore-auto.
        host_budget: host bytes the host copies may hold (default: what this machine or its
            cgroup allows; see ``plan``). On "cuda" the pinned host pool is reserved for the
            plan's host copies at once and never grows past this budget.
        allow_sub_batches: let the plan split the batch (changes BatchNorm statistics; off
            unless True or policy="modnn"); announced and shown in ``stats.notes``.
        cache: reuse a plan from the on-disk cache (see ``outcore.plan``).

    Every argument is checked before the capture (InvalidArgumentError subclasses).
        distributed: data parallel (``outcore.distributed``): True (the default process
            group, initialised from torchrun's environment if needed) or a
            ``torch.distributed`` ProcessGroup. ``example_batch`` is then this rank's share;
            gradients are averaged over the ranks. Extra options: ``bucket_cap`` (bytes),
            ``timeout`` (a timedelta), ``host`` (a multi-GPU host profile).

    Returns:
        A Trainer; ``trainer.step(x, y)`` trains one step.
    """
    from outcore import progress
    from outcore.hardware import default_gpu
    from outcore.runtime.devices import make_device
    from outcore.validation import check_budget, check_device, check_gpu, check_policy

    limit = check_budget(budget)
    check_device(device)
    gpu = check_gpu(gpu)
    dp_options = ("bucket_cap", "timeout", "host") if distributed not in (False, None) else ()
    check_policy(policy, {k: v for k, v in options.items() if k not in dp_options})
    if distributed is not False and distributed is not None:
        from outcore.distributed import compile_data_parallel

        return compile_data_parallel(model, loss_fn, example_batch, distributed=distributed,
                                     budget=budget, device=device, gpu=gpu, policy=policy,
                                     **options)
    with progress.task(f"capturing {type(model).__name__}"):
        graph = capture(model, loss_fn, example_batch)

    def recapture(parts: int) -> Graph:
        from outcore.runtime.subbatch import split_batch

        dims = options.get("batch_dims")
        return capture(model, loss_fn, split_batch(tuple(example_batch), parts, dims)[0])

    planned = plan(graph, limit, policy=policy, gpu=gpu or default_gpu(graph, device),
                   recapture=recapture, simulate=False, allow_sub_batches=allow_sub_batches,
                   cache=cache, host_budget=host_budget, **options)
    dev = make_device(device, capacity=limit, gpu=gpu if device == "cpu-emulated" else None)
    reserve = getattr(dev, "reserve_host", None)
    if callable(reserve):  # a pinned pool: one segment for the plan's host copies, bounded
        dev.pool.limit = planned.host_budget  # type: ignore[attr-defined]
        reserve(planned.host_sizes)
    return Trainer(model, planned, dev, limit)
