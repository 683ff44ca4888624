"""``outcore.compile`` and the Trainer it returns: planned training steps, one plan per signature.

The Trainer keeps a bounded LRU cache of planned steps keyed by the *step signature*:

* the batch's structure, constants and per-tensor shape, dtype and device (the last, smaller
  batch of an epoch or another sequence length is another signature);
* each parameter's dtype, device, ``requires_grad`` and shape (freezing a layer, or
  replacing a weight with one of another shape, invalidates);
* the forward hooks and pre-hooks registered (``outcore.capture.hooks.forward_hooks``: one
  registered after a step was captured is captured again);
* the plain Python values the modules hold (``outcore.capture.python_state``: a
  temperature or a flag changed between steps is captured again, with a ReplanWarning);
* the autocast the step runs under (``compile(..., autocast=...)`` or the one in effect at
  the ``step`` call).

A step whose signature is not cached is captured and planned again under the same budget
and policy (``stats.replans`` counts those after the first; ``stats.cache_size`` bounds the
cache, least recently used first out; a signature evicted and met again, or the
``MANY_SHAPES``-th one, raises a ``ReplanWarning`` once, with how to make fewer shapes).
A step whose specialisation guard fails (``outcore.capture.specialize``: a value read in
Python changed) is captured again too; the ``MANY_RESPECIALISATIONS``-th time, a
``ReplanWarning`` says once what that costs (``respecialised_note``).
With ``transfer_plans=True`` its plan is carried from a cached signature's instead of
searched when the new graph has
the same structure, is near in size, the schedule fits the budget there and simulates
nearly as close to the compute floor as on its own graph (``outcore.plan_transfer``;
``stats.transfers``), and searched for its own sizes after ``PROMOTE_AFTER`` steps
(``stats.promotions``). A step specialised on
tensor values (``outcore.capture.specialize``) whose values changed is captured again for
the new ones.

The step computes what the model computes in the state the user left it: each module's
``training`` flag is part of the signature (``model.eval()``, or a backbone whose BatchNorm
layers were frozen with ``.eval()``, is captured again in that state: running statistics
used and not updated, dropout off), and gradients are computed as ``loss.backward()``
would, also in eval mode (with an ``EvalModeWarning`` once, as a reminder). Under
``torch.no_grad()`` ``step`` runs the forward eagerly and returns the loss, without a plan,
a budget or gradients (``stats.eval_steps`` counts them): the validation loop.
Gradient hooks on parameters or modules, which a planned step would never call, are
refused (``outcore.capture.hooks``); a batch tensor with ``requires_grad=True`` gets its
``.grad`` as in eager PyTorch.

Mixed precision: the autocast is captured into the graph (its casts are explicit ATen ops), so
the executor runs with autocast off. Loss scaling for float16 works with
``torch.amp.GradScaler``: ``trainer.step(batch, scaler=scaler)`` seeds the backward with the
scaler's scale (as ``scaler.scale(loss).backward()`` does), then ``scaler.step(optimizer)``
and ``scaler.update()`` unscale, skip steps with inf/NaN gradients and adapt the scale as
they do in eager PyTorch. The returned loss is unscaled.

A failed step leaves the model as it was (``outcore.runtime.failsafe``); ``close()`` or
``with outcore.compile(...) as trainer:`` stops the device's copy engines.
``PlannedTrainer`` (``outcore.planned_trainer``; re-exported here) runs given planned steps
with the model state fixed; data parallel (``outcore.distributed``) builds on it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from outcore.capture.aot import autocast_state, capture
from outcore.capture.batching import (
    LossFn,
    announce_constant_replan,
    batch_of,
    own_storage,
    plain_batch,
    split_batch_leaves,
    step_loss_and_output,
)
from outcore.capture.hooks import check_hooks, forward_hooks
from outcore.capture.python_state import (
    announce_replan,
    announce_side_effects,
    python_state,
)
from outcore.capture.step import SpecializationMismatch, StaleSpecialization
from outcore.errors import (
    CaptureError,
    EvalModeWarning,
    InvalidArgumentError,
    NothingToTrainError,
    OutcoreError,
    ReplanWarning,
    SubBatchWarning,
)
from outcore.fixed_step import (
    batch_device_type,
    layout,
    under_autocast,
    without_autocast,
)
from outcore.graph.ir import Graph
from outcore.hardware import default_gpu
from outcore.log import announce
from outcore.plan.plan import Plan
from outcore.plan_transfer import PROMOTE_AFTER
from outcore.planned import MACHINE, PlannedStep, cost_model_for, plan
from outcore.runtime.executor import RngState, rng_state, set_rng_state
from outcore.runtime.link_calibration import LinkCalibration
from outcore.trainer_stats import (
    MANY_RESPECIALISATIONS,
    MANY_SHAPES,
    TrainerStats,
    respecialised_note,
    shapes_note,
)

DEFAULT_CACHE_SIZE = 8


def _split_outputs_notes(executor: Any, parts: int) -> list[str]:
    """What ``outputs=True`` gives under a split into ``parts`` sub-batches, where it is not
    simply the whole batch's outputs on the device (``runtime.sub_batch_assembly``)."""
    from outcore.runtime.sub_batch_assembly import after_step, unassembled

    notes = []
    missing = unassembled(executor.graph)
    if missing:
        notes.append(
            f"outputs=True under {parts} sub-batches: tensor(s) {missing} of what the model "
            "returns (in pytree order) are statistics of the whole batch (an auxiliary loss, "
            "a mean), which no split gives; trainer.outputs holds None in their place")
    if not after_step(executor, parts).outputs_on_device:
        notes.append(
            "outputs=True under sub-batches: the whole batch's outputs do not fit on the "
            "device beside what the step holds at its end within the plan's peak, so "
            "trainer.outputs is handed over in host memory (move it with .to(device) where "
            "it fits)")
    return notes


@dataclass
class _Entry:
    planned: PlannedStep
    executor: Any  # outcore.runtime.executor.Executor
    #: the allocator's peak of this plan's step (``TrainerStats.measured_peak``); None: not
    #: measured yet, or not measured on this device
    allocator_peak: int | None = None
    #: the batch signature it was captured for (``BatchSignature.describe``)
    shape: str = ""
    #: its plan was carried from another shape's (``outcore.plan_transfer``), and the steps
    #: run on that carried plan so far (the Trainer plans it afresh past ``PROMOTE_AFTER``)
    carried: bool = False
    uses: int = 0
    #: the searched step a carried plan came from, and that step's batch signature: plans
    #: are carried from searched ones only, so size and overhead are measured against
    #: the shape the plan was searched for, never against an earlier carry
    origin: PlannedStep | None = None
    origin_shape: str = ""


class Trainer:
    """Runs planned training steps; build it with ``outcore.compile``.

    ``step(x, y)`` or ``step(batch)`` runs forward and backward and accumulates gradients
    into the model's ``.grad`` (call ``optimizer.zero_grad()`` between steps, as with
    ``loss.backward()``); it returns the loss, detached.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, example_batch: Any, *,
                 device: Any, budget: int | None, policy: str = "auto",
                 gpu: str | None = None, autocast: torch.dtype | None = None,
                 cache_size: int = DEFAULT_CACHE_SIZE, options: dict[str, Any] | None = None,
                 allow_sub_batches: bool | None = None, cache: bool | None = None,
                 host_budget: int | str | None = MACHINE, device_kind: str = "cpu",
                 transfer_plans: bool = False, keep_outputs: bool = False) -> None:
        if cache_size < 1:
            raise InvalidArgumentError(cache_size, "a cache_size of at least 1 (planned "
                                       "steps kept, one per batch signature)")
        self.model = model
        self.loss_fn = loss_fn
        self.device = device
        self.budget = budget
        self.policy = policy
        self.gpu = gpu
        self.autocast = autocast
        self.cache_size = cache_size
        self.options = dict(options or {})
        self.allow_sub_batches = allow_sub_batches
        self.cache = cache
        self.host_budget = host_budget
        self.device_kind = device_kind
        self.transfer_plans = transfer_plans
        self.keep_outputs = keep_outputs
        #: with ``keep_outputs``: what the model returned in the last step or evaluation
        #: (detached; ``outcore.compile(..., outputs=True)``), else None
        self.outputs: Any = None
        self.stats = TrainerStats()
        self._warned_eval = False
        self._warned_shapes = False
        self._respecialisations = 0  # steps captured again after a failed guard
        self._evicted: set[Hashable] = set()  # signatures dropped from the full cache
        self._cache: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._current = self._entry(own_storage(plain_batch(example_batch)))
        #: the emulated link, scaled to this model (``outcore.runtime.link_calibration``)
        self._link = LinkCalibration.for_device(device, self._gpu_for, self._current.planned)
        self.stats.link_bandwidth = self._link.bandwidth if self._link else None

    def _gpu_for(self, graph: Graph) -> str:
        """The hardware profile ``graph`` is planned with (``gpu=`` or the default)."""
        return self.gpu or default_gpu(graph, self.device_kind)

    # -- what the current plan is ----------------------------------------------------------
    @property
    def planned(self) -> PlannedStep:
        """The planned step of the last signature used."""
        return self._current.planned

    @property
    def executor(self) -> Any:
        """The executor of the last signature used."""
        return self._current.executor

    @property
    def plan(self) -> Plan:
        return self._current.planned.plan

    def explain(self) -> list[dict[str, Any]]:
        """Per activation, what was decided and why (see ``PlannedStep.explain``)."""
        return self._current.planned.explain()

    # -- stepping --------------------------------------------------------------------------
    def step(self, *args: Any, scaler: Any = None) -> torch.Tensor:
        """One training step on ``(x, y)`` or on one batch; returns the loss (detached).

        ``scaler``: a ``torch.amp.GradScaler``; the gradients come out scaled by its scale,
        for ``scaler.step(optimizer)`` to unscale. In eval mode (``model.eval()``) the forward
        runs eagerly without gradient instead.
        """
        # a slice of a larger tensor is planned and moved at its own size, not its storage's
        batch = own_storage(batch_of(args, self.loss_fn))
        if not torch.is_grad_enabled():
            return self._eval_step(batch)
        _refuse_nothing_to_train(self.model, batch)
        if not self.model.training and not self._warned_eval:
            self._warned_eval = True
            announce("the model is in eval mode: this step computes the eval-mode model's "
                     "gradients, as loss.backward() would; to evaluate without gradients, "
                     "call trainer.step under torch.no_grad()", EvalModeWarning)
        scale = 1.0
        if scaler is not None and scaler.is_enabled():
            scale = float(scaler.scale(torch.ones((), device=batch_device_type(batch))))
        entry = self._entry(batch)
        rng = rng_state()
        try:
            result = self._measured_run(entry, batch, scale)
        except SpecializationMismatch as failed:
            start = time.perf_counter()
            result = self._run_recaptured(batch, scale, rng)
            self._respecialised(failed, time.perf_counter() - start)
        entry = self._current  # the entry that ran (a fresh one after a failed guard)
        if self.keep_outputs:
            self.outputs = entry.planned.graph.source.model_output(result.outputs)
        self.stats.tensor_peak = result.peak_bytes
        self.stats.measured_peak = (result.peak_bytes if entry.allocator_peak is None
                                    else entry.allocator_peak)
        self.stats.step_seconds = result.seconds
        self.stats.steps += 1
        self.stats.history.append(float(result.loss))
        return result.loss

    def _measured_run(self, entry: _Entry, batch: Any, scale: float) -> Any:
        """``_run``; on the first step of a plan on ``device="cpu"`` (one sub-batch), under
        the allocator's measurement (``TrainerStats.measured_peak``)."""
        if (self.device_kind not in ("cpu", "cuda") or entry.allocator_peak is not None
                or entry.planned.plan.sub_batches > 1):
            return self._run(entry, batch, scale)
        from outcore.runtime.devices.allocator_peak import (
            allocator_peak,
            cuda_allocator_peak,
            held_before,
        )

        measure = cuda_allocator_peak if self.device_kind == "cuda" else allocator_peak
        measured = measure(lambda: self._run(entry, batch, scale))
        entry.allocator_peak = held_before(entry.planned.graph) + measured.peak
        return measured.result

    def _respecialised(self, failed: SpecializationMismatch, seconds: float) -> None:
        """Count a capture after a failed guard; warn once at ``MANY_RESPECIALISATIONS``."""
        self._respecialisations += 1
        if self._respecialisations == MANY_RESPECIALISATIONS:
            announce(respecialised_note(self._respecialisations, seconds, str(failed)),
                     ReplanWarning, stacklevel=4)

    def _run_recaptured(self, batch: Any, scale: float,
                        rng: RngState) -> Any:
        """Capture, plan and run the step again after a specialisation guard failed.

        The failed run applied nothing; the capture records the values from the random
        state the step started with, and the run draws from it, as eager's one step would.
        A second failure means the values differ within one step (between its sub-batches):
        that is refused with a CaptureError, as it cannot equal eager's step."""
        set_rng_state(rng)
        entry = self._entry(batch, fresh=True)
        set_rng_state(rng)
        try:
            return self._measured_run(entry, batch, scale)
        except StaleSpecialization as again:  # it raises with this batch's own values too
            raise again.raised from None
        except SpecializationMismatch as again:
            parts = entry.planned.plan.sub_batches
            raise CaptureError(
                f"the model's Python control flow reads tensor values (.item(), an `if` on a "
                f"tensor) and this step was split into {parts} sub-batches whose values "
                "differ, so no split of it computes eager's step. Give it a budget that "
                "holds the whole batch (no sub-batches), or make the branch depend on "
                "shapes or Python values (torch.where)" if parts > 1 else
                "the model's Python control flow reads tensor values that differ between "
                "two runs of the same batch from the same random state; outcore cannot "
                "specialise on them. Make the branch depend on shapes or Python values "
                "(torch.where)") from again

    def _run(self, entry: _Entry, batch: Any, scale: float = 1.0) -> Any:
        from outcore.runtime.subbatch import run_sub_batches

        parts = entry.planned.plan.sub_batches
        # the graph holds the captured autocast's casts; an ambient autocast must not recast
        with without_autocast(batch):
            if parts > 1:
                return run_sub_batches(entry.executor, batch, parts, loss_scale=scale)
            if self._link is None:
                return entry.executor.run(batch, loss_scale=scale)
            result = self._link.run(entry.executor, entry.planned, batch, loss_scale=scale)
        self.stats.link_bandwidth = self._link.bandwidth
        return result

    def _eval_step(self, batch: Any) -> torch.Tensor:
        cast = autocast_state(self.autocast, batch, self.model)
        with torch.no_grad(), under_autocast(cast):
            loss, output = step_loss_and_output(self.model, self.loss_fn, batch)
        if self.keep_outputs:
            self.outputs = output
        self.stats.eval_steps += 1
        return loss.detach()

    # -- the plan cache --------------------------------------------------------------------
    def signature(self, batch: Any) -> tuple[Any, ...]:
        """The cache key of a training step on ``batch`` (see the module docstring)."""
        _, batch_sig = split_batch_leaves(batch)
        return (batch_sig, layout(self.model), autocast_state(self.autocast, batch, self.model),
                forward_hooks(self.model), python_state(self.model, self.loss_fn))

    def _entry(self, batch: Any, fresh: bool = False) -> _Entry:
        check_hooks(self.model)
        key = self.signature(batch)
        entry = None if fresh else self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
            self.stats.cache_hits += 1
            if entry.carried:
                entry.uses += 1
                if entry.uses > PROMOTE_AFTER:  # used often enough to earn its own search
                    entry = self._cache[key] = self._promote(entry, batch)
        else:
            announce_replan((self.model, self.loss_fn), next(reversed(self._cache), None), key)
            announce_constant_replan((k[0] for k in self._cache if isinstance(k, tuple)),
                                     key[0], batch)
            seen = len(self._evicted | set(self._cache) | {key})
            if (key in self._evicted or seen >= MANY_SHAPES) and not self._warned_shapes:
                self._warned_shapes = True
                announce(shapes_note(self.cache_size, seen, key in self._evicted),
                         ReplanWarning, stacklevel=4)
            entry = self._prepare(batch)
            # keyed by the state the capture left: a forward may set a value on its first
            # call (Hugging Face's config.problem_type), as the traced forward did
            before, key = key, self.signature(batch)
            announce_side_effects((self.model, self.loss_fn), before, key)
            self._cache[key] = entry
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._evicted.add(self._cache.popitem(last=False)[0])
                self.stats.evictions += 1
        self._current = entry
        self.stats.predicted_peak = entry.planned.predicted_peak
        self.stats.sub_batches = entry.planned.plan.sub_batches
        self.stats.signature = split_batch_leaves(batch)[1].describe()
        self.stats.notes = list(entry.planned.notes)
        return entry

    def _prepare(self, batch: Any) -> _Entry:
        """Capture and plan a step for ``batch``'s signature (the plan carried from a cached
        shape's where one fits: ``outcore.plan_transfer``)."""
        from outcore import progress

        with progress.task(f"capturing {type(self.model).__name__}"):
            start = torch.get_rng_state()
            graph = capture(self.model, self.loss_fn, batch, autocast=self.autocast,
                            outputs=self.keep_outputs)
            self._measure_temporaries(graph, batch, start)
        entry = self._planned_entry(graph, batch, carry=self.transfer_plans)
        if self.stats.captures:
            self.stats.replans += 1
        self.stats.captures += 1
        return entry

    def _promote(self, entry: _Entry, batch: Any) -> _Entry:
        """``entry`` (a carried plan) planned for its own graph's sizes; ``entry`` itself,
        no longer promoted, when the policy finds no plan there (the carried one fits)."""
        from outcore.log import info

        info(f"planning the batch {entry.shape} for its own sizes after {entry.uses - 1} "
             "steps on a plan carried from another shape")
        try:
            promoted = self._planned_entry(entry.planned.graph, batch, carry=False)
        except OutcoreError as exc:  # no plan of its own (or one refused): the carried one runs
            info(f"kept the carried plan of the batch {entry.shape}: {exc}")
            entry.carried = False
            entry.planned.notes.append("the search for this shape's own sizes found no plan "
                                       f"({type(exc).__name__}); the carried plan stays")
            return entry
        self.stats.promotions += 1
        return promoted

    def _carried(self, graph: Graph) -> tuple[PlannedStep, str, PlannedStep] | None:
        """A cached searched plan carried to ``graph`` (``plan_transfer.best_carry``): the
        carried step, and the searched step and batch signature it came from; or None."""
        from outcore.plan_transfer import best_carry
        from outcore.planned import resolve_host_budget

        seen: set[int] = set()
        sources: list[tuple[str, PlannedStep]] = []
        for entry in reversed(self._cache.values()):  # each searched plan once
            shape, searched = ((entry.origin_shape, entry.origin) if entry.origin is not None
                               else (entry.shape, entry.planned))
            if id(searched) not in seen:
                seen.add(id(searched))
                sources.append((shape, searched))
        if not sources:
            return None
        host_limit, host_source = resolve_host_budget(graph, self.host_budget)
        cost = cost_model_for(self._gpu_for(graph), graph)
        return best_carry(sources, graph, self.budget, cost, host_limit=host_limit,
                          host_source=host_source, cuda=self.device_kind == "cuda")

    def _planned_entry(self, graph: Graph, batch: Any, *, carry: bool) -> _Entry:
        """A cache entry running ``graph`` (captured from ``batch``): its plan carried from a
        cached shape's when ``carry`` and one fits, else searched under the budget."""
        from outcore.runtime.executor import Executor
        from outcore.runtime.sub_batch_rng import prepare as prepare_random
        from outcore.runtime.subbatch import split_batch

        dims = self.options.get("batch_dims")

        def recapture(parts: int) -> Graph:
            part = split_batch(batch, parts, dims)[0]
            start = torch.get_rng_state()
            sub = capture(self.model, self.loss_fn, part, autocast=self.autocast,
                          outputs=self.keep_outputs)
            self._measure_temporaries(sub, part, start)
            return sub

        def plan_for(budget: int | None, split: bool | None = self.allow_sub_batches
                     ) -> PlannedStep:
            return plan(graph, budget, policy=self.policy,
                        gpu=self._gpu_for(graph),
                        recapture=recapture, simulate=False,
                        allow_sub_batches=split, cache=self.cache,
                        host_budget=self.host_budget, **self.options)

        carried = self._carried(graph) if carry else None
        if carried is not None:
            planned = carried[0]
        else:
            planned = plan_for(self.budget)
            if self.device_kind == "cuda" and self.budget is not None:
                from outcore.plan.allocator_rounding import within_allocator_rounding

                planned = within_allocator_rounding(planned, self.budget, plan_for)
            if self.budget is not None and planned.plan.sub_batches > 1 and any(
                    t.requires_grad for t in split_batch_leaves(batch)[0]):
                from outcore.runtime.sub_batch_assembly import with_room_for_input_grads

                planned = with_room_for_input_grads(
                    planned, self.budget, plan_for, lambda limit: plan_for(limit, False))
        reserve = getattr(self.device, "reserve_host", None)
        if callable(reserve):  # a pinned pool: one segment for the plan's host copies, bounded
            self.device.pool.limit = planned.host_budget
            reserve(planned.host_sizes)
        executor = Executor(planned.graph, planned.schedule, self.device)
        if planned.plan.sub_batches > 1:  # random ops: eager's draws, or say they cannot
            text = prepare_random(executor, planned.plan.sub_batches)
            if text is not None:
                planned.notes.append(text)
            if self.keep_outputs:
                for text in _split_outputs_notes(executor, planned.plan.sub_batches):
                    planned.notes.append(text)
                    announce(text, SubBatchWarning)
        shape = split_batch_leaves(batch)[1].describe()
        if carried is None:
            return _Entry(planned, executor, shape=shape)
        self.stats.transfers += 1
        return _Entry(planned, executor, shape=shape, carried=True, uses=1,
                      origin=carried[2], origin_shape=carried[1])

    def _measure_temporaries(self, graph: Graph, batch: Any, rng_state: torch.Tensor) -> None:
        """On ``device="cpu"`` or ``"cuda"``: each op's kernel temporaries, measured by the
        allocator (``outcore.cost.measure_temporaries``) onto the graph, so the plan budgets
        them; each measuring run starts from ``rng_state``, the generator's state the capture
        started from (values it specialised on come out the same). The emulated device
        counts tensors only (its capacity is enforced on that count): there only what the
        kernels really return beyond the graph's outputs is measured."""
        if getattr(graph.source, "fake", True):
            return
        from outcore.cost.measure_temporaries import measure_temporaries

        measure_temporaries(graph, batch, device=self.device_kind, rng_state=rng_state)

    def close(self) -> None:
        """Stop the device's copy engines (if any); idempotent. A trainer that is never
        closed stops them when it is garbage-collected or the interpreter exits."""
        _close(self.device)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refuse_nothing_to_train(model: nn.Module, batch: Any) -> None:
    """Raise ``NothingToTrainError`` when no parameter of ``model`` and no tensor of
    ``batch`` requires grad (eager's ``loss.backward()`` raises there too)."""
    if any(p.requires_grad for p in model.parameters()):
        return
    if any(t.requires_grad for t in split_batch_leaves(batch)[0]):
        return
    raise NothingToTrainError(
        "nothing in this step requires grad: every parameter of the model is frozen "
        "(requires_grad=False) and no batch tensor requires grad, so loss.backward() would "
        "raise ('element 0 of tensors does not require grad'). Unfreeze the parameters you "
        "train (p.requires_grad_(True)), or call trainer.step under torch.no_grad() to only "
        "evaluate the loss.")


def _close(device: Any) -> None:
    closer = getattr(device, "close", None)
    if closer is not None:
        closer()


def __getattr__(name: str) -> Any:
    """``PlannedTrainer`` and ``compile``, which moved to ``outcore.planned_trainer`` and
    ``outcore.compiling`` (they build on this module, so they are imported on first use
    rather than at the top)."""
    if name == "PlannedTrainer":
        from outcore.planned_trainer import PlannedTrainer

        return PlannedTrainer
    if name in ("compile", "WEIGHTS_OPTIONS"):  # moved to outcore.compiling, which imports this
        import outcore.compiling

        return getattr(outcore.compiling, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
