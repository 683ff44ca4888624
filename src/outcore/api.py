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
    PlannedStep,
    cost_model_for,
    plan,
    policies,
)
from outcore.policies.registry import config_for
from outcore.units import format_bytes, parse_bytes

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

    def __str__(self) -> str:
        return (f"peak {format_bytes(self.measured_peak)} measured vs "
                f"{format_bytes(self.predicted_peak)} predicted; "
                f"step {self.step_seconds * 1e3:.1f} ms")


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
                                  sub_batches=planned.plan.sub_batches)

    @property
    def plan(self) -> Plan:
        return self.planned.plan

    def explain(self) -> list[dict[str, Any]]:
        """Per activation, what was decided and why (see ``PlannedStep.explain``)."""
        return self.planned.explain()

    def step(self, x: Any, y: Any) -> torch.Tensor:
        """One training step on ``(x, y)``; returns the loss (a detached scalar)."""
        from outcore.runtime.subbatch import run_sub_batches

        parts = self.planned.plan.sub_batches
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
        """Stop the device's copy engines (if any)."""
        closer = getattr(self.device, "close", None)
        if closer is not None:
            closer()


def compile(model: nn.Module, loss_fn: Callable[..., torch.Tensor], example_batch: Any, *,
            budget: int | str | None = "6GiB", device: str = "cuda", gpu: str | None = None,
            policy: str = "auto", **options: Any) -> Trainer:
    """Capture, plan and prepare ``model`` to train within ``budget`` on ``device``.

    Args:
        model, loss_fn, example_batch: as for ``outcore.capture``: ``loss_fn(model(x), y)``.
        budget: device memory to stay within (bytes or "12GB"/"11.5GiB"); None = unbounded.
        device: "cuda", "cpu-emulated" (the accelerator emulated on this CPU, with the
            budget as its capacity and a copy engine per direction) or "cpu".
        gpu: hardware profile for planning and, on "cpu-emulated", for the link bandwidth.
        policy: a name from ``outcore.policies()``; "auto" = outcore-auto.

    Returns:
        A Trainer; ``trainer.step(x, y)`` trains one step.
    """
    from outcore.runtime.devices import make_device

    limit = None if budget is None else parse_bytes(budget)
    config_for(policy, options)  # an unknown policy or option fails before any capture
    graph = capture(model, loss_fn, example_batch)

    def recapture(parts: int) -> Graph:
        from outcore.runtime.subbatch import split_batch

        return capture(model, loss_fn, split_batch(tuple(example_batch), parts)[0])

    planned = plan(graph, limit, policy=policy, gpu=gpu, recapture=recapture, simulate=False,
                   **options)
    dev = make_device(device, capacity=limit, gpu=gpu if device == "cpu-emulated" else None)
    return Trainer(model, planned, dev, limit)
