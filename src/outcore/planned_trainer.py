"""``PlannedTrainer``: runs given planned steps, without ``outcore.compile``'s signature cache.

``outcore.distributed.DataParallelTrainer`` builds on it. The model state the step was
captured in is fixed (``outcore.fixed_step.FixedStep``: train/eval flags, frozen parameters,
Python values, forward hooks, the autocast; a change is refused before anything runs), but
the batch is not: a batch of another shape or dtype (the smaller last batch of a DataLoader
without ``drop_last``) is captured and planned on its first step with the first plan's
policy and budget, and kept for later batches of that signature (``ShapeCache``; logged on
the ``outcore`` logger). Its gradients are the ones eager PyTorch computes on that batch.

Under ``torch.no_grad()`` (a validation loop) ``step`` runs the forward eagerly under the
captured autocast and returns the loss, detached: no plan, no gradient, the model in the
train/eval mode the user left it, as ``outcore.compile``'s Trainer does.

Invariant: after ``step(x, y)`` (or ``step(batch)``) with grad enabled, each parameter's
``.grad`` is what ``loss_fn(model(x), y).backward()`` accumulates into it (bit for bit for
plans with the framework's kernels), for every batch signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from outcore.capture.batching import batch_of, own_storage, step_loss_and_output
from outcore.errors import BatchMismatchError, OutcoreError
from outcore.fixed_step import SHAPES, FixedStep, ShapeCache, under_autocast, without_autocast
from outcore.plan.plan import Plan
from outcore.planned import PlannedStep
from outcore.runtime.link_calibration import LinkCalibration
from outcore.trainer import TrainerStats, _close

#: ``batch -> PlannedStep``: captures and plans the step for a batch of a new signature
Replan = Callable[[Any], PlannedStep]


@dataclass
class FixedEntry:
    """One batch signature's planned step and the executor that runs it."""

    planned: PlannedStep
    executor: Any  # outcore.runtime.executor.Executor


def _check_same_model(model: nn.Module, planned: PlannedStep) -> None:
    """Refuse a ``planned`` step captured from another model object than ``model``: its
    executor reads and writes the captured model's parameters (their values, ``.grad``),
    so stepping it would train that other object while ``model`` stayed as it was."""
    captured = getattr(planned.graph.source.step_module, "model", model)
    if captured is not model:
        raise OutcoreError(
            f"the planned step was captured from another {type(captured).__name__} object "
            f"than the {type(model).__name__} given: its steps would read and write that "
            "object's parameters and gradients, not this model's. Build the PlannedTrainer "
            "with the model the step was captured from, or capture and plan this one "
            "(outcore.capture, outcore.plan).")


class PlannedTrainer:
    """Runs planned steps of fixed model state, one per batch signature (module doc).

    ``planned``: the step of the example batch. ``replan``: plans a batch of another
    signature; by default it is captured with the planned step's loss function and
    autocast, and planned with its policy under ``budget`` (sub-batches allowed only when
    the first plan split). ``shapes``: the other signatures kept (least recently used out).
    """

    #: why this trainer cannot call hooks on a leaf's gradient (``FixedStep``); None: its
    #: commit calls them (``outcore.runtime.leaf_hooks``)
    LEAF_HOOKS: str | None = None

    def __init__(self, model: nn.Module, planned: PlannedStep, device: Any,
                 budget: int | None, *, replan: Replan | None = None,
                 shapes: int = SHAPES) -> None:
        _check_same_model(model, planned)
        self.model = model
        self.device = device
        self.budget = budget
        self.replan: Replan = replan or replan_like(model, planned, budget)
        self.stats = TrainerStats(predicted_peak=planned.predicted_peak,
                                  sub_batches=planned.plan.sub_batches,
                                  notes=list(planned.notes))
        self._fixed = FixedStep(model, way_out=(
            "Set it back, or use outcore.compile, which captures again when it changes."),
            leaf_hooks=self.LEAF_HOOKS)
        step = planned.graph.source.step_module
        #: the loss function and the autocast the step was captured with
        self.loss_fn = step.loss_fn
        self.autocast: tuple[str, torch.dtype] | None = step.autocast
        #: the step was captured keeping the model's outputs (``capture(..., outputs=True)``):
        #: ``outputs`` holds what the model returned in the last step or evaluation
        self.keep_outputs = planned.graph.source.outputs is not None
        self.outputs: Any = None
        first = self._make_entry(planned)
        self._current = first
        #: the emulated link, scaled to this model (``outcore.runtime.link_calibration``); the
        #: plans were made outside, for the GPU the device emulates
        self._link = LinkCalibration.for_device(device, lambda graph: device.emulates, planned)
        self.stats.link_bandwidth = self._link.bandwidth if self._link else None
        self._shapes: ShapeCache[Any] = ShapeCache(
            first, lambda batch: _matches(planned, batch),
            lambda batch: self._make_entry(self.replan(batch)),
            what=f"the planned step of {type(model).__name__}", size=shapes)

    # -- the current plan (the last batch signature stepped) ---------------------------------
    @property
    def planned(self) -> PlannedStep:
        return self._current.planned

    @property
    def executor(self) -> Any:
        return self._current.executor

    @property
    def plan(self) -> Plan:
        return self.planned.plan

    @property
    def replans(self) -> int:
        """Batch signatures planned after the first."""
        return self._shapes.replans

    def entries(self) -> list[Any]:
        """Every planned signature's entry, the first one first."""
        return self._shapes.entries()

    def _make_entry(self, planned: PlannedStep) -> Any:
        """The entry that runs ``planned`` (data parallel adds its reducer)."""
        from outcore.runtime.executor import Executor

        return FixedEntry(planned, Executor(planned.graph, planned.schedule, self.device))

    def _check_python_state(self) -> None:
        """Refuse a step after the model left the state its step was captured in: a
        training flag, a parameter's ``requires_grad``/dtype/shape, a Python value
        (``outcore.capture.python_state``) or a forward hook (``outcore.fixed_step``)."""
        self._fixed.check()

    def explain(self) -> list[dict[str, Any]]:
        """Per activation, what was decided and why (see ``PlannedStep.explain``)."""
        return self.planned.explain()

    # -- stepping ----------------------------------------------------------------------------
    def step(self, *args: Any) -> torch.Tensor:
        """One training step; returns the loss (a detached scalar). ``step(x, y)`` or
        ``step(batch)``, as ``outcore.compile``'s Trainer takes them (a dict batch, or the
        model's input when the loss function is None: ``batch_of``). Under
        ``torch.no_grad()``: the eager forward's loss (``eval_step``)."""
        if not torch.is_grad_enabled():
            return self.eval_step(*args)
        entry, batch = self._prepare(*args)
        return self._execute(entry, batch)

    def _prepare(self, *args: Any) -> tuple[Any, Any]:
        """A training step's checks and the plan of its batch's signature (planned now
        when new): ``(entry, batch)``. Raises when the step is refused; changes no model
        state (parameters, ``.grad``, buffers), whether it raises or not."""
        from outcore.batch_check import check_batch

        # as captured: a slice is counted at its own size
        batch = own_storage(batch_of(args, self.loss_fn))
        self._fixed.check(batch)
        entry = self._shapes.entry(batch)
        parts = entry.planned.plan.sub_batches
        check_batch(entry.planned.graph, batch, parts)
        return entry, batch

    def _execute(self, entry: Any, batch: Any) -> torch.Tensor:
        """Run the prepared ``entry`` on ``batch`` (``_prepare``) and record its stats."""
        parts = entry.planned.plan.sub_batches
        self._current = entry
        self.stats.predicted_peak = entry.planned.predicted_peak
        self.stats.sub_batches = parts
        self.stats.notes = list(entry.planned.notes)
        self.stats.replans = self._shapes.replans
        with without_autocast(batch):  # the graph holds the captured autocast's casts
            result = self._run(entry, batch)
        self.stats.measured_peak = result.peak_bytes
        if self.keep_outputs:
            self.outputs = entry.planned.graph.source.model_output(result.outputs)
        self.stats.step_seconds = result.seconds
        self.stats.steps += 1
        self.stats.history.append(float(result.loss))
        return result.loss

    def _run(self, entry: Any, batch: Any) -> Any:
        """Run ``entry``'s planned step on ``batch`` and apply its gradients."""
        from outcore.runtime.subbatch import run_sub_batches

        parts = entry.planned.plan.sub_batches
        if parts > 1:
            return run_sub_batches(entry.executor, batch, parts)
        return self._single_run(entry, batch)

    def _single_run(self, entry: Any, batch: Any, **options: Any) -> Any:
        """``entry.executor.run(batch, **options)`` (one sub-batch), timed on the first
        ``link_calibration.STEPS`` steps of an emulated link being scaled to the model."""
        if self._link is None:
            return entry.executor.run(batch, **options)
        result = self._link.run(entry.executor, entry.planned, batch, **options)
        self.stats.link_bandwidth = self._link.bandwidth
        return result

    def eval_step(self, *args: Any) -> torch.Tensor:
        """The loss of the eager forward on the batch (``step``'s arguments) without
        gradient, under the captured autocast, in the mode the model is in; nothing planned
        or accumulated."""
        with torch.no_grad(), under_autocast(self.autocast):
            loss, output = step_loss_and_output(self.model, self.loss_fn,
                                                batch_of(args, self.loss_fn))
        if self.keep_outputs:
            self.outputs = output
        self.stats.eval_steps += 1
        return loss.detach()

    def close(self) -> None:
        """Stop the device's copy engines (if any); idempotent."""
        _close(self.device)

    def __enter__(self) -> PlannedTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _matches(planned: PlannedStep, batch: Any) -> bool:
    """Whether ``batch`` is of the signature ``planned`` was captured for: the same structure
    and non-tensor values (baked into the step), which tensors require grad, and its
    tensors' shapes and dtypes (with sub-batches, ``parts`` times the captured batch:
    ``check_batch``)."""
    from outcore.batch_check import check_batch
    from outcore.capture.batching import split_batch_leaves

    captured = getattr(planned.graph.source, "signature", None)
    if captured is not None:
        sig = split_batch_leaves(batch)[1]
        if (sig.spec, sig.constants) != (captured.spec, captured.constants):
            return False
        if _asks_grad(sig) != _asks_grad(captured):
            return False  # a gradient asked for (or no longer): another step
    try:
        check_batch(planned.graph, batch, planned.plan.sub_batches)
    except BatchMismatchError:
        return False
    return True


def _asks_grad(signature: Any) -> tuple[bool, ...]:
    """Which of a signature's tensors require grad; () when none does."""
    return tuple(signature.requires_grad) if any(signature.requires_grad) else ()


def replan_like(model: nn.Module, planned: PlannedStep, budget: int | None) -> Replan:
    """A ``Replan`` that captures a batch as ``planned``'s step was captured (its loss
    function and autocast) and plans it with ``planned``'s policy under ``budget``; with
    sub-batches only when ``planned`` has them. ``outcore.compile``'s other options and cost
    model are not known here: a trainer built from them passes its own ``replan``."""
    from outcore.capture import capture
    from outcore.planned import plan
    from outcore.policies.auto.portfolio import policy_of_label
    from outcore.runtime.subbatch import split_batch

    step = planned.graph.source.step_module
    cast = step.autocast[1] if step.autocast is not None else None
    split = planned.plan.sub_batches > 1
    # the plan's label names the portfolio's pick ("outcore-auto (modnn)"): re-plan with the
    # policy that made it, outcore-auto, whose pick may differ for the new batch
    policy = policy_of_label(planned.plan.policy)

    def replan(batch: Any) -> PlannedStep:
        keep = planned.graph.source.outputs is not None
        graph = capture(model, step.loss_fn, batch, autocast=cast, outputs=keep)

        def recapture(parts: int) -> Any:
            return capture(model, step.loss_fn, split_batch(batch, parts)[0], autocast=cast,
                           outputs=keep)

        return plan(graph, budget, policy=policy, simulate=False,
                    recapture=recapture if split else None, allow_sub_batches=split)

    return replan
