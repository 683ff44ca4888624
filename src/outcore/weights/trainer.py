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

``trainer.train_step(x, y)`` does the whole training step instead (what ``loss.backward();
clip_grad_norm_(...); optimizer.step(); optimizer.zero_grad()`` does eagerly), with the
optimizer step where the plan put it: each parameter held in host memory is stepped on the
CPU as soon as its gradient has landed there, overlapped with the rest of backward
(``outcore.weights.host_step``); the others after the planned step. Clipping
(``clip_grad_norm=``) and a GradScaler need every gradient first: with either, every step
runs after backward (the simulator's ``host_steps(..., barrier=True)`` prices that).
Mixed precision: ``master=MasterWeights(model)`` for a bf16/fp16 model, the optimizer built
on the fp32 masters (``outcore.weights.mixed``).

Batch shapes: the model state is fixed (``outcore.fixed_step``: train/eval, frozen
parameters, Python values, forward hooks, autocast; a change is refused), the batch is not:
a batch of another signature (the smaller last batch of a DataLoader without ``drop_last``)
is captured on its first step and planned with the first plan's placement (the same
parameters held in host memory, ``choose_weights(given=...)``), on the same device, and kept
for later batches of that signature (``replans``; ``outcore.fixed_step.ShapeCache``). Its
step equals eager's as the first shape's does.

Budget rule: ``predicted_peak`` of the step (what the emulated device measures, to the
byte) plus the optimizer state of the device-held parameters is at most ``budget``; the
device's capacity is ``budget`` less that state. With ``master=`` that state is 0: the
masters and their state are CPU tensors whatever the placement (``MasterWeights``), so
the plan counts them in host memory (``choice.host_state``), and every parameter's step
runs on the host.

On ``device="cuda"`` (model on the GPU when compiled) the held parameters move into one
pinned host segment (``host_weights.pin_parameters``; ``param.data`` is replaced, so they
are CPU tensors from then on, their optimizer state too) and the pinned pool is reserved
for the step's offloads (the sent gradients) before the first step. The optimizer then
holds parameters on both devices: torch steps the held ones with its CPU kernels (on the
stepper's thread, after their copies' events), the others with its CUDA kernels after the
planned step; the results equal eager CUDA PyTorch's up to the rounding of CPU against
CUDA kernels (tests/cuda/test_cuda_weights.py states the tolerance). Gradients read back
from host memory are copied out of the pool's slots by ``step`` (they outlive the step
there); ``train_step`` consumes them within the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from outcore.capture.aot import capture
from outcore.capture.batching import LossFn, batch_of
from outcore.errors import BatchMismatchError, OutcoreError
from outcore.fixed_step import FixedStep, ShapeCache, under_autocast, without_autocast
from outcore.runtime.host_weights import LandingDevice
from outcore.units import parse_bytes
from outcore.weights.choose import WeightChoice, choose_weights
from outcore.weights.host_step import HostStepper
from outcore.weights.mixed import MasterWeights
from outcore.weights.optimizer import built_update_bytes, state_bytes


class WeightTrainer:
    """Runs planned steps whose parameters may live in host memory (module doc)."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, example_batch: Any, *,
                 optimizer: torch.optim.Optimizer, budget: int, device: str = "cpu-emulated",
                 gpu: str | None = None, slowdown: float = 1.0,
                 bandwidth: float | None = None, master: MasterWeights | None = None,
                 clip_grad_norm: float | None = None, profile: Any = None,
                 device_options: dict[str, Any] | None = None, weights: str = "auto",
                 host_adam_rate: float | None = None, keep_outputs: bool = False) -> None:
        from outcore.planned import cost_model_for

        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.master = master
        self.clip_grad_norm = clip_grad_norm
        self.budget = budget
        self._planning = (gpu, device, profile)
        self._weights = (weights, host_adam_rate)  # choose_weights' mode= and host_adam_rate=
        self.keep_outputs = keep_outputs
        #: with ``keep_outputs``: what the model returned in the last step or evaluation
        #: (detached; ``outcore.compile(..., optimizer=..., outputs=True)``), else None
        self.outputs: Any = None
        graph = capture(model, loss_fn, example_batch, outputs=keep_outputs)
        self.state = state_bytes(optimizer, model, master)
        if master is not None:  # a master the optimizer does not step is allocated too
            for name, m in master.masters.items():
                self.state.setdefault(name, m.nbytes)
        choice = self._choose(graph, cost_model_for(gpu, graph, device), None)
        self.device = _make_device(device, budget - choice.device_state, gpu=gpu,
                                   slowdown=slowdown, bandwidth=bandwidth,
                                   options=device_options)
        self.on_cuda = device == "cuda"
        self.pinned: torch.Tensor | None = None
        if self.on_cuda:
            self.pinned = _to_pinned_host(self.device, graph, choice.schedule,
                                          model, optimizer)
        self.measured_peak = 0
        self._fixed = FixedStep(model, loss_fn, batch=example_batch, leaf_hooks=(
            "the weights trainer moves gradients to host memory and steps the optimizer "
            "as they are made"))
        first = self._shape(graph, choice)
        self._current = first
        self._shapes: ShapeCache[_Shape] = ShapeCache(
            first, lambda batch: _matches(graph, batch), self._replan,
            what=f"the weights trainer of {type(model).__name__}",
            evicted=lambda shape: shape.stepper.close())

    # -- one planned step per batch signature (outcore.fixed_step.ShapeCache) -----------------
    @property
    def graph(self) -> Any:
        """The captured step of the last batch signature stepped."""
        return self._current.graph

    @property
    def choice(self) -> WeightChoice:
        return self._current.choice

    @property
    def stepper(self) -> HostStepper:
        return self._current.stepper

    @stepper.setter
    def stepper(self, value: HostStepper) -> None:  # tests swap in an instrumented one
        self._current.stepper = value

    @property
    def executor(self) -> Any:
        return self._current.executor

    @property
    def replans(self) -> int:
        """Batch signatures planned after the first."""
        return self._shapes.replans

    def _choose(self, graph: Any, cost: Any, given: list[str] | None) -> WeightChoice:
        from outcore.sim.simulator import simulate

        return choose_weights(graph, self.budget, cost, self.state, profile=self._planning[2],
                              given=given, mode=self._weights[0],
                              host_adam_rate=self._weights[1],
                              update_bytes=built_update_bytes(self.optimizer),
                              masters=self.master.masters if self.master else (),
                              simulate=lambda g, s: simulate(g, s, cost).step_time)

    def _shape(self, graph: Any, choice: WeightChoice) -> _Shape:
        from outcore.runtime.executor import Executor

        params = dict(self.model.named_parameters())
        stepper = HostStepper(graph, choice.schedule, params, self.optimizer, self.master)
        landing = LandingDevice(self.device, stepper.landed)
        stepper.device = self.device
        return _Shape(graph, choice, stepper,
                      Executor(graph, choice.schedule, landing, grad_hook=stepper))

    def _replan(self, batch: Any) -> _Shape:
        """Capture and plan a batch of another signature (a smaller last batch) with the
        first plan's placement: the same parameters held in host memory (on CUDA they
        already live there), the activations planned for this batch; the device and its
        capacity stay (the device-held optimizer state is the same)."""
        from outcore.plan.schedule import Offload
        from outcore.planned import cost_model_for

        first = self._shapes.first
        cast = self._fixed.autocast
        graph = capture(self.model, self.loss_fn, batch,
                        autocast=cast[1] if cast is not None else None,
                        outputs=self.keep_outputs)
        gpu, device, _ = self._planning
        held = sorted(first.graph.tensors[t].source for t in first.choice.placement.params)
        choice = self._choose(graph, cost_model_for(gpu, graph, device), held)
        if self.on_cuda:  # room in the pinned pool for this plan's offloads
            self.device.reserve_host([graph.storage_bytes(i.tensor)
                                      for i in choice.schedule.instructions
                                      if isinstance(i, Offload)])
        return self._shape(graph, choice)

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

    def _batch(self, args: tuple[Any, ...]) -> Any:
        """The step's batch, its planned step made current: a model that left its captured
        state (``outcore.fixed_step``: train/eval, frozen parameters, Python values,
        forward hooks) raises ``UnsupportedModelError`` before anything runs or is
        stepped; a batch of a new signature is captured and planned (``_replan``)."""
        from outcore.batch_check import check_batch

        batch = batch_of(args, self.loss_fn)
        self._fixed.check(batch)
        shape = self._shapes.entry(batch)
        check_batch(shape.graph, batch)
        self._current = shape
        return batch

    def _eval_step(self, args: tuple[Any, ...]) -> torch.Tensor:
        """Under ``torch.no_grad()`` (validation): the forward eagerly, the loss detached,
        no gradient and no optimizer step, as the Trainer of ``outcore.compile`` does. On
        CUDA with parameters held in host memory the model cannot run eagerly: refused."""
        from outcore.capture.batching import step_loss_and_output

        if self.on_cuda and self.choice.placement.params:
            raise OutcoreError("trainer.step under torch.no_grad() runs the model eagerly, "
                               "but some of its parameters are held in host memory on "
                               "CUDA; evaluate with a model whose weights are on the GPU")
        # the captured autocast, as the step computes
        with torch.no_grad(), under_autocast(self._fixed.autocast):
            loss, output = step_loss_and_output(self.model, self.loss_fn,
                                                batch_of(args, self.loss_fn))
        if self.keep_outputs:
            self.outputs = output
        return loss.detach()

    def _kept(self, result: Any) -> None:
        """``outputs`` from a step's ``result``: what the model returned, in its structure."""
        if self.keep_outputs:
            self.outputs = self.graph.source.model_output(result.outputs)

    def step(self, *args: Any, scaler: Any = None) -> torch.Tensor:
        """Forward and backward on ``(x, y)``; gradients accumulate into ``.grad`` (the
        user steps the optimizer). With ``scaler`` (a ``torch.amp.GradScaler``) they come
        out scaled, for ``scaler.step(optimizer)``. Not with ``master=`` (use
        ``train_step``)."""
        if not torch.is_grad_enabled():
            return self._eval_step(args)
        if self.master is not None:
            raise OutcoreError("with master weights the gradients go to the masters: use "
                               "trainer.train_step(x, y), which steps them")
        batch = self._batch(args)
        self.stepper.start(overlap=False)
        with without_autocast(batch):
            result = self.executor.run(batch, loss_scale=_scale(scaler),
                                       apply=not self.on_cuda)
        if self.on_cuda:  # out of the pool's slots, which the next step's offloads reuse
            result.grads = {n: g.clone() if g.device.type == "cpu" else g
                            for n, g in result.grads.items()}
            self.executor.apply(result, inputs=self.executor.step.batch_tensors(batch))
        self.measured_peak = result.peak_bytes
        self._kept(result)
        return result.loss

    def train_step(self, *args: Any, scaler: Any = None) -> torch.Tensor:
        """One whole training step on ``(x, y)`` (module doc): forward, backward, clipping
        (``clip_grad_norm``), the optimizer step where planned, gradients cleared. Equal to
        the eager loop ``backward; clip_grad_norm_; step; zero_grad`` (with ``scaler``:
        ``scale(loss).backward; unscale_; clip; scaler.step; scaler.update``); the LR
        scheduler stays the user's (``sched.step()`` after it)."""
        if not torch.is_grad_enabled():
            return self._eval_step(args)
        scale = _scale(scaler)
        scaled = scaler is not None and scaler.is_enabled()
        barrier = self.clip_grad_norm is not None or scaled  # they need every gradient
        batch = self._batch(args)
        self.stepper.start(overlap=not barrier)
        try:
            with without_autocast(batch):
                result = self.executor.run(batch, apply=False, loss_scale=scale)
        finally:
            stepped = self.stepper.join()
        self.measured_peak = result.peak_bytes
        self._kept(result)
        rest = {n: g for n, g in result.grads.items() if n not in stepped}
        if self.master is not None:
            for name, g in rest.items():
                self.master.set_grad(name, g)
            self.executor.apply_grads({}, result.buffers)
        else:
            self.executor.apply_grads(rest, result.buffers)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if scaled:
            if self.clip_grad_norm is not None:
                scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
            scaler.step(self.optimizer)
            scaler.update()
        else:
            if self.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
            self.optimizer.step()
        self.optimizer.zero_grad()
        if self.master is not None:
            for name in rest:
                self.master.publish(name)
        return result.loss

    def close(self) -> None:
        """Join the host steps, close the device and unpin the held parameters' segment
        (they keep its memory, pageable from then on)."""
        for shape in self._shapes.entries():
            shape.stepper.close()
        close = getattr(self.device, "close", None)
        if callable(close):
            close()
        if self.pinned is not None:
            from outcore.runtime.devices.cuda import unpin_exact

            unpin_exact(self.pinned)
            self.pinned = None

    def __enter__(self) -> WeightTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Shape:
    """One batch signature's captured step, weights choice, host stepper and executor."""

    graph: Any
    choice: WeightChoice
    stepper: HostStepper
    executor: Any


def _matches(graph: Any, batch: Any) -> bool:
    """Whether ``batch`` is of the signature ``graph`` was captured for."""
    from outcore.batch_check import check_batch

    try:
        check_batch(graph, batch)
    except BatchMismatchError:
        return False
    return True


def _make_device(device: str, capacity: int, *, gpu: str | None, slowdown: float,
                 bandwidth: float | None, options: dict[str, Any] | None) -> Any:
    """The device the steps run on; ``options``: CudaDevice keyword arguments (cuda only)."""
    from outcore.runtime.devices import make_device

    if device == "cuda":
        from outcore.runtime.devices.cuda import CudaDevice

        return CudaDevice(capacity, **(options or {}))
    if options:
        raise OutcoreError(f"device_options apply to device='cuda', not {device!r}")
    emulated: dict[str, Any] = {}
    if device == "cpu-emulated":
        emulated = {"slowdown": slowdown}
        emulated.update({"bandwidth": bandwidth} if bandwidth is not None else {"gpu": gpu})
    return make_device(device, capacity=capacity, **emulated)


def _to_pinned_host(device: Any, graph: Any, schedule: Any, model: nn.Module,
                    optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
    """CUDA: move the held parameters into one pinned segment and reserve the pinned pool
    for the step's offloads; the segment (None: nothing held)."""
    from outcore.plan.schedule import Offload
    from outcore.plan.weights import gradients, parameters
    from outcore.runtime.devices.cuda import pin_pages
    from outcore.runtime.host_weights import pin_parameters

    by_id = {tid: name for name, tid in parameters(graph).items()}
    held = {by_id[tid] for tid in schedule.host_static}
    grads = gradients(graph)
    stray = sorted(n for n, g in grads.items() if g in set(schedule.host_outputs)
                   and n not in held)
    if stray:
        raise OutcoreError(f"the schedule sends the gradient of {stray[0]!r} to host memory "
                           "but keeps the parameter on the GPU; on CUDA a sent gradient's "
                           "parameter must be held in host memory too")
    named = dict(model.named_parameters())
    segment = pin_parameters([named[n] for n in sorted(held)], pin_pages, optimizer)
    device.reserve_host([graph.storage_bytes(i.tensor) for i in schedule.instructions
                         if isinstance(i, Offload)])
    return segment


def _scale(scaler: Any) -> float:
    if scaler is not None and scaler.is_enabled():
        return float(scaler.scale(torch.ones(())))
    return 1.0


def compile(model: nn.Module, loss_fn: LossFn, example_batch: Any, *,
            optimizer: torch.optim.Optimizer, budget: int | str, device: str = "cpu-emulated",
            gpu: str | None = None, slowdown: float = 1.0, bandwidth: float | None = None,
            master: MasterWeights | None = None, clip_grad_norm: float | None = None,
            profile: Any = None, device_options: dict[str, Any] | None = None,
            weights: str = "auto", host_adam_rate: float | None = None,
            outputs: bool = False) -> WeightTrainer:
    """A ``WeightTrainer`` for ``model`` within ``budget`` (bytes or "2GB"); see the module
    doc. ``slowdown`` slows the emulated copy engine (races); ``bandwidth``: its link
    bytes/s instead of ``gpu``'s ratio; ``master``: fp32 master weights of a low-precision
    model (the optimizer is built on them); ``clip_grad_norm``: the max norm
    ``train_step`` clips to; ``profile``: the hardware profile pricing the optimizer step
    (default: the cost model's, whose host fields are measured for "this-cpu");
    ``device_options``: keyword arguments of ``CudaDevice`` with ``device="cuda"``
    (``copy_delay_cycles``, ``poison``, ``timing``, ``host_limit``); ``weights`` ("auto",
    "device" or "host") and ``host_adam_rate``: as ``outcore.plan``'s (``choose_weights``'s
    ``mode`` and ``host_adam_rate``); ``outputs``: after each step ``trainer.outputs``
    holds what the model returned (as ``outcore.compile(..., outputs=True)``)."""
    return WeightTrainer(model, loss_fn, example_batch, optimizer=optimizer,
                         budget=parse_bytes(budget), device=device, gpu=gpu,
                         slowdown=slowdown, bandwidth=bandwidth, master=master,
                         clip_grad_norm=clip_grad_norm, profile=profile,
                         device_options=device_options, weights=weights,
                         host_adam_rate=host_adam_rate, keep_outputs=outputs)
