"""``outcore.weights.compile``: train a model whose weights, gradients and optimizer state
do not fit the device, with the user's own optimizer.

``compile(model, loss_fn, batch, optimizer=opt, budget=...)`` captures the step, sizes the
optimizer's state (``outcore.weights.optimizer.state_bytes``), chooses which parameters live
in host memory together with the activation plan (``outcore.weights.choose``) and returns a
``WeightTrainer``. Its ``step(x, y)`` runs the planned step and accumulates the gradients
into ``.grad`` (held parameters' gradients arrive from host memory); the user then steps the
optimizer as with eager PyTorch (clipping, schedulers, ``zero_grad``, ``state_dict`` and a
``GradScaler`` work unchanged)::

    trainer = outcore.weights.compile(model, loss_fn, (x, y), optimizer=opt, budget="2GB",
                                      device="cpu-emulated")
    loss = trainer.step(x, y)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step(); opt.zero_grad()

Budget rule: ``predicted_peak`` of the step (what the emulated device measures, to the
byte) plus the optimizer state of the device-held parameters is at most ``budget``; the
emulated device's capacity is ``budget`` less that state. Only ``device="cpu-emulated"``
(and "cpu") run host-held weights today: on CUDA the parameters would have to move to
pinned host memory, which is not implemented (``check_host_weights`` refuses it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from outcore.capture.aot import capture
from outcore.capture.batching import LossFn, batch_of
from outcore.units import parse_bytes
from outcore.weights.choose import HOST_ADAM_RATE, WeightChoice, choose_weights
from outcore.weights.optimizer import state_bytes


class WeightTrainer:
    """Runs planned steps whose parameters may live in host memory (module doc)."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, example_batch: Any, *,
                 optimizer: torch.optim.Optimizer, budget: int, device: str = "cpu-emulated",
                 gpu: str | None = None, slowdown: float = 1.0,
                 bandwidth: float | None = None,
                 host_adam_rate: float = HOST_ADAM_RATE) -> None:
        from outcore.planned import cost_model_for
        from outcore.runtime.devices import make_device
        from outcore.runtime.executor import Executor
        from outcore.sim.simulator import simulate

        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.graph = capture(model, loss_fn, example_batch)
        cost = cost_model_for(gpu, self.graph, device)
        self.state = state_bytes(optimizer, model)
        self.choice: WeightChoice = choose_weights(
            self.graph, budget, cost, self.state, host_adam_rate=host_adam_rate,
            simulate=lambda g, s: simulate(g, s, cost).step_time)
        emulated: dict[str, Any] = {}
        if device == "cpu-emulated":
            emulated = {"slowdown": slowdown}
            emulated.update({"bandwidth": bandwidth} if bandwidth is not None else {"gpu": gpu})
        self.device = make_device(device, capacity=budget - self.choice.device_state,
                                  **emulated)
        self.executor = Executor(self.graph, self.choice.schedule, self.device)
        self.measured_peak = 0

    @property
    def predicted_peak(self) -> int:
        """Device bytes at the step's peak (the optimizer state of device-held parameters
        is ``choice.device_state`` on top)."""
        return self.choice.peak

    def held(self) -> list[str]:
        """Names of the parameters held in host memory."""
        return sorted(self.graph.tensors[t].source.removeprefix("model.")
                      for t in self.choice.placement.params)

    def explain(self) -> list[str]:
        """What moved and why (``WeightChoice.explain``)."""
        return self.choice.explain(self.graph)

    def step(self, *args: Any, scaler: Any = None) -> torch.Tensor:
        """One step on ``(x, y)``; gradients accumulate into ``.grad``. With ``scaler`` (a
        ``torch.amp.GradScaler``) they come out scaled, for ``scaler.step(optimizer)``."""
        batch = batch_of(args, self.loss_fn)
        scale = 1.0
        if scaler is not None and scaler.is_enabled():
            scale = float(scaler.scale(torch.ones(())))
        result = self.executor.run(batch, loss_scale=scale)
        self.measured_peak = result.peak_bytes
        return result.loss

    def close(self) -> None:
        close = getattr(self.device, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> WeightTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def compile(model: nn.Module, loss_fn: LossFn, example_batch: Any, *,
            optimizer: torch.optim.Optimizer, budget: int | str, device: str = "cpu-emulated",
            gpu: str | None = None, slowdown: float = 1.0, bandwidth: float | None = None,
            host_adam_rate: float = HOST_ADAM_RATE) -> WeightTrainer:
    """A ``WeightTrainer`` for ``model`` within ``budget`` (bytes or "2GB"); see the module
    doc. ``slowdown`` slows the emulated copy engine (races); ``bandwidth``: its link
    bytes/s instead of ``gpu``'s ratio; ``host_adam_rate``: this CPU's
    AdamW parameters per second (``outcore.weights.optimizer.measure_host_adam``)."""
    return WeightTrainer(model, loss_fn, example_batch, optimizer=optimizer,
                         budget=parse_bytes(budget), device=device, gpu=gpu,
                         slowdown=slowdown, bandwidth=bandwidth,
                         host_adam_rate=host_adam_rate)
