"""``DataParallelTrainer``: a Trainer whose step averages gradients over the ranks.

As with PyTorch's DistributedDataParallel:

* parameters and buffers are broadcast from rank 0 when the trainer is built, and buffers
  (e.g. BatchNorm running statistics) again before a step, so every rank starts it from
  rank 0's: before each training step, and before the first forward under
  ``torch.no_grad()`` after one, not before the training step after such a forward (DDP's
  ``require_forward_param_sync``: a forward broadcasts when the previous one was a
  training forward, and at the first); BatchNorm normalises with each rank's own batch
  statistics (as DDP without SyncBatchNorm), ``nn.SyncBatchNorm`` with the whole batch's
  over the ranks (``outcore.distributed.sync_bn``; its recomputes replay,
  ``outcore.distributed.replay``);
* the step's batch is used with its own storage, as it was captured
  (``outcore.capture.batching.own_storage``, in ``PlannedTrainer.step``);
* a share of another shape (the smaller last batch; an uneven split, 10 samples over 4
  ranks) is captured and planned on this rank on its first step and kept
  (``PlannedTrainer``); its gradients fill the same buckets as the first plan's
  (``outcore.distributed.layout``), started in bucket order, so every rank issues the same
  all-reduces whatever its share, as DDP does (it averages over the world size, whatever
  each rank's batch). A plan that split the first share into sub-batches all-reduces
  ``.grad`` after the step for every shape; one that did not plans every shape in one pass;
* the first training step compares the ranks' first plans (``same_plan_everywhere``)
  before the gradients' collectives, after the step's agreement (below);
* after ``step`` every rank's ``.grad`` holds the average over the ranks of their
  gradients (accumulated into ``.grad`` as ``loss.backward()`` does); the optimizer step
  stays the user's. Accumulating over steps, the average is of the accumulated ``.grad``
  (DDP all-reduces what autograd accumulated: ``(prior + g_r) / N`` summed, which rounds
  differently from ``prior + sum(g_r / N)``), so the bits equal DDP's. A tied parameter's
  contributions are summed into its one slot before the all-reduce, as autograd sums them
  before DDP copies ``.grad`` (``outcore.distributed.reducer``);
* with one pass (``plan.sub_batches == 1``) the executor's ``BucketReducer`` all-reduces
  each bucket as backward makes it final (overlapped with the rest of backward); with
  sub-batches the gradients are final only after the last pass, so ``.grad`` is
  all-reduced then (moDNN's "gradient accumulation" at the end of the iteration). Each
  share's plan has its own passes (4 samples in 2, the last batch's 3 in 1): the gradient
  is DDP's with the rank's passes under ``no_sync`` but the last, each pass its own
  BatchNorm statistics (``outcore.runtime.subbatch``). A step whose all-reduce fails
  leaves ``.grad`` and the buffers as it found them, as a failed bucketed step does;
* a step refused on one rank alone (its checks of the model state and the batch, the
  re-plan of its share: over the budget, ``_check_collectives``, the user's loss failing
  while the share is captured) raises on every rank at once: each step's checks and
  re-plan (``_prepare_everywhere``) end in an agreement (``RankContext.agree``, one
  all-reduce of a status flag, the step's only collective beyond DDP's), which every rank
  enters whether its own preparation succeeded or raised, before the plan comparison, the
  buffer broadcast and the run. The refusing rank raises its own error, the others
  ``DistributedError`` naming it and its reason; nothing has run on any rank (parameters,
  ``.grad``, buffers and the optimizer's state as before the step), and the ranks have
  issued the same collectives, so skipping that batch on every rank goes on training. The
  first plans' agreement is at the end of ``data_parallel_trainer``, where the ranks
  first wait for one another through the store (``RankContext.arrive``, up to
  ``PLANNING_WAIT``: a short group timeout does not end a rank still planning). A rank
  that re-plans longer than the others at a step keeps them waiting in the step's
  agreement, within the group's timeout, as it kept them in their next collective before;
* under ``torch.no_grad()`` (validation) ``step`` runs the forward eagerly and returns this
  rank's loss: no gradient, no all-reduce (only DDP's buffer broadcast above), the model
  in the train/eval mode the user left it;
* a step that raises on one rank while it runs (after the agreement: out of device memory,
  a kernel's error) is reported to the others (``RankContext``), whose next collective
  raises ``DistributedError`` naming that rank: at once when its process ends, else at the
  latest after the group's timeout (a failure in the run is not agreed on: that would take
  a second collective per step, inside backward before the first bucket's all-reduce).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from outcore.distributed.group import DistributedError, RankContext
from outcore.distributed.layout import BucketLayout, tied_names
from outcore.distributed.reducer import BucketReducer
from outcore.distributed.replay import CollectiveReplay
from outcore.distributed.sync_bn import ALL_REDUCE_TARGET, SyncBatchNormCollectiveError
from outcore.errors import OutcoreError
from outcore.fixed_step import SHAPES
from outcore.plan.grad_buckets import GradBucket, tied_gradients
from outcore.plan.weights import gradients
from outcore.planned import PlannedStep
from outcore.planned_trainer import FixedEntry, PlannedTrainer

#: The step's agreement point (``DataParallelTrainer._prepare_everywhere``), as errors name it.
STEP_CHECKS = "the step's checks and the plan of its share"


@dataclass
class RankEntry(FixedEntry):
    """One share signature's planned step on this rank, with its collectives."""

    reducer: BucketReducer | None
    replay: CollectiveReplay
    buckets: list[GradBucket]
    #: parameter name -> the gradient id of its bucket slot
    slots: dict[str, int]
    #: names of the gradients summed into another's slot (tied parameters)
    folded: frozenset[str]


class DataParallelTrainer(PlannedTrainer):
    """A Trainer on one rank of a data-parallel group (module doc); built by
    ``outcore.compile(..., distributed=True)``. ``buckets``: the first plan's, assigned
    with ``tied`` (the model's tied parameter names, ``layout.tied_names``);
    ``replan``: captures and plans a share of another signature (``PlannedTrainer``), kept
    for ``shapes`` signatures besides the first."""

    LEAF_HOOKS = ("the data-parallel step hands each gradient to the all-reduce as it is "
                  "made, where DDP calls a parameter's hooks before reducing it")

    def __init__(self, model: nn.Module, planned: PlannedStep, device: Any,
                 budget: int | None, ctx: RankContext, buckets: list[GradBucket], *,
                 replan: Callable[[Any], PlannedStep] | None = None,
                 tied: Sequence[Sequence[str]] | None = None, shapes: int = SHAPES) -> None:
        self.ctx = ctx
        self.tied = [tuple(g) for g in (tied_names(model) if tied is None else tied)]
        self.layout = BucketLayout.of(planned.graph, buckets, self.tied)
        self._split = planned.plan.sub_batches  # the first plan's passes
        self._plans_compared = False
        self._sync_next = True  # DDP's require_forward_param_sync
        super().__init__(model, planned, device, budget, replan=replan, shapes=shapes)

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def buckets(self) -> list[GradBucket]:
        return list(self._current.buckets)

    @property
    def reducer(self) -> BucketReducer | None:
        return self._current.reducer  # type: ignore[no-any-return]

    @property
    def replay(self) -> CollectiveReplay:
        return self._current.replay  # type: ignore[no-any-return]

    def _make_entry(self, planned: PlannedStep) -> RankEntry:
        """The rank's entry for ``planned``: the layout's buckets and their reducer, the
        replayed collectives; refused when its collectives could differ from the other
        ranks' (``_check_collectives``)."""
        from outcore.runtime.executor import Executor

        self._check_collectives(planned)
        buckets = self.layout.buckets(planned.graph, planned.schedule)
        reducer = None
        if buckets and self.ctx.world_size > 1:
            reducer = BucketReducer(planned.graph, buckets, self.ctx,
                                    tied_gradients(planned.graph, self.tied))
        replay = CollectiveReplay(planned.graph, planned.schedule)
        executor = Executor(planned.graph, planned.schedule, self.device, grad_hook=reducer,
                            impls=replay.impls)
        name_of = {tid: name for name, tid in gradients(planned.graph).items()}
        slots = {name_of[t]: t for b in buckets for t in b.tensors}
        folded = frozenset(name_of[t] for t in (reducer.folded if reducer else ()))
        return RankEntry(planned, executor, reducer, replay, buckets, slots, folded)

    def _check_collectives(self, planned: PlannedStep) -> None:
        """Raise OutcoreError when a plan of another share signature would issue other
        collectives than the first plan (which every rank shares): a split where the first
        was bucketed, or, with SyncBatchNorm (one all-reduce per pass), another split."""
        parts = planned.plan.sub_batches
        if self.layout.first and parts > 1:
            raise OutcoreError(
                f"rank {self.ctx.rank}: this share's plan splits it into {parts} sub-batches, "
                "whose gradients are all-reduced after the step, while the first share's are "
                "all-reduced in buckets during backward: the ranks' collectives would not "
                "match. Give a budget that holds this share in one pass.")
        syncs = any(op.target == ALL_REDUCE_TARGET for op in planned.graph.ops)
        if syncs and parts != self._split:
            raise OutcoreError(
                f"rank {self.ctx.rank}: this share's plan runs {parts} sub-batch(es) and the "
                f"first share's {self._split}: SyncBatchNorm all-reduces once per pass, so the "
                "ranks' collectives would not match. Pass allow_sub_batches=False, or drop "
                "the uneven last batch (DistributedSampler(drop_last=True) and a DataLoader "
                "with drop_last=True).")

    def step(self, *args: Any) -> torch.Tensor:
        """One data-parallel step on this rank's share, ``step(x, y)`` or ``step(batch)``
        (``PlannedTrainer.step``); returns this rank's loss.
        Under ``torch.no_grad()``: the eager forward's loss (module doc). A step refused on
        any rank raises on every rank, before any collective of the step (module doc)."""
        training = torch.is_grad_enabled()
        prepared = self._prepare_everywhere(*args) if training else None
        try:
            if training and not self._plans_compared:
                first = self.entries()[0]
                self._collective("the comparison of the ranks' plans", lambda: (
                    same_plan_everywhere(self.ctx, first.planned, first.buckets)))
                self._plans_compared = True
            if self._sync_next:
                self._collective("the broadcast of buffers from rank 0", self._sync_buffers)
            loss = self.eval_step(*args) if prepared is None else self._execute(*prepared)
            self._sync_next = training
        except SyncBatchNormCollectiveError as exc:
            raise self.ctx.error("the all-reduce of a SyncBatchNorm's statistics",
                                 exc) from exc
        except DistributedError:
            raise
        except BaseException as exc:
            self.ctx.report_failure(exc)
            raise
        return loss

    def _prepare_everywhere(self, *args: Any) -> tuple[RankEntry, Any]:
        """``_prepare`` (the step's checks and the plan of a new share signature: what can
        refuse on one rank alone), then the step's agreement (``RankContext.agree``),
        which every rank enters whether its own preparation succeeded or raised. A rank
        that refused raises its error, every other rank ``DistributedError`` naming it;
        nothing has run, no collective of the step has been issued, nothing is applied."""
        try:
            prepared = self._prepare(*args)
        except Exception as exc:
            self.ctx.agree(STEP_CHECKS, exc)
            raise
        except BaseException as exc:  # an interrupt: no agreement, the others time out
            self.ctx.report_failure(exc)
            raise
        self.ctx.agree(STEP_CHECKS)
        return prepared

    def _run(self, entry: RankEntry, batch: Any) -> Any:
        """``PlannedTrainer._run`` with the bucketed parameters' ``.grad`` handed to the
        reducer (it all-reduces ``gradient + .grad`` as DDP does; the result replaces
        ``.grad``) and the folded tied gradients left out (they are in their slot). A
        failed step leaves every ``.grad`` as it was."""
        entry.replay.reset()
        if entry.reducer is None:
            if self.ctx.world_size == 1:
                return super()._run(entry, batch)
            return self._run_then_reduce(entry, batch)
        params = dict(self.model.named_parameters(remove_duplicate=False))
        taken = {n: params[n].grad for n in entry.slots if params[n].grad is not None}
        for name in taken:
            params[name].grad = None
        entry.reducer.prior = {entry.slots[n]: g for n, g in taken.items() if g is not None}
        try:
            result = self._single_run(entry, batch, apply=False)
            for name in entry.folded:
                result.grads.pop(name, None)
            entry.executor.apply(result, inputs=entry.executor.step.batch_tensors(batch))
            return result
        except BaseException:
            for name, grad in taken.items():
                params[name].grad = grad
            raise
        finally:
            entry.reducer.prior = {}

    def _run_then_reduce(self, entry: RankEntry, batch: Any) -> Any:
        """A plan without buckets (sub-batches): run it with ``.grad`` taken out, then
        all-reduce ``(gradient + prior .grad) / N`` per parameter as DDP does. A failed step
        or all-reduce (another rank refused its share, or failed) puts every ``.grad`` back
        (a batch tensor's too) and the buffers (BatchNorm running statistics) as the step
        found them: nothing of a step that did not average is left applied."""
        from outcore.capture.batching import split_batch_leaves
        from outcore.runtime.devices.base import untracked

        # a tied parameter once; a batch tensor that requires grad gets its rows' gradient
        # (DDP does not reduce input gradients), and gets its .grad back on a failure too
        inputs = [t for t in split_batch_leaves(batch)[0] if t.requires_grad]
        input_grads = [t.grad for t in inputs]
        params = list(self.model.parameters())
        taken = [p.grad for p in params]
        buffers = list(self.model.buffers())
        with untracked():  # a host copy outside the plan's device memory (a few floats)
            saved = [b.detach().to("cpu", copy=True) for b in buffers]
        for t in (*params, *inputs):
            t.grad = None
        try:
            result = super()._run(entry, batch)
            self._collective("the all-reduce of the accumulated gradients",
                             lambda: self._allreduce_grads(params, taken))
            with torch.no_grad():  # this step's rows' gradient added to what was there
                for t, prior in zip(inputs, input_grads, strict=True):
                    if prior is not None:
                        t.grad = prior if t.grad is None else prior.add_(t.grad)
            return result
        except BaseException:
            with torch.no_grad():
                for p, prior in zip(params, taken, strict=True):
                    p.grad = prior
                for t, prior in zip(inputs, input_grads, strict=True):
                    t.grad = prior
                for b, value in zip(buffers, saved, strict=True):
                    b.copy_(value)
            raise

    def _collective(self, what: str, fn: Any) -> None:
        try:
            fn()
        except RuntimeError as exc:
            raise self.ctx.error(what, exc) from exc

    def _sync_buffers(self) -> None:
        broadcast_state(self.model, self.ctx, parameters=False)

    def _allreduce_grads(self, params: list[nn.Parameter],
                         priors: list[torch.Tensor | None]) -> None:
        """Each ``.grad`` (this step's gradient, a new tensor) plus its ``prior`` (left
        untouched) divided by the world size and all-reduced, in parameter order."""
        with torch.no_grad():
            for p, prior in zip(params, priors, strict=True):
                if p.grad is None:
                    if prior is None:
                        continue
                    p.grad = prior.clone()  # not made this step, accumulated before
                elif prior is not None:
                    p.grad.add_(prior)  # as autograd accumulates: the same sum's bits
                p.grad.div_(self.ctx.world_size)
                dist.all_reduce(p.grad, group=self.ctx.group)


def broadcast_state(model: nn.Module, ctx: RankContext, *, parameters: bool = True) -> None:
    """Copy rank 0's parameters (if ``parameters``) and buffers to every rank, in place."""
    if ctx.world_size == 1:
        return
    tensors = [*(model.parameters() if parameters else ()), *model.buffers()]
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, group=ctx.group, group_src=0)


def same_plan_everywhere(ctx: RankContext, planned: PlannedStep,
                         buckets: list[GradBucket]) -> None:
    """Raise OutcoreError unless every rank planned the same schedule and buckets: the
    ranks' collectives (bucket all-reduces, SyncBatchNorm's) must match one to one. Plans
    differ when the ranks were given another policy, budget or options, or shares that
    plan differently, or a measured cost model (``gpu="this-cpu"``) whose timings differ
    per rank."""
    if ctx.world_size == 1:
        return
    text = repr((planned.schedule.instructions, sorted(planned.schedule.variants.items()),
                 planned.plan.sub_batches, [(b.tensors, b.offsets) for b in buckets]))
    mine = hashlib.sha256(text.encode()).hexdigest()
    digests: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(digests, mine, group=ctx.group)
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise OutcoreError(f"ranks {differ} planned another step than rank 0 (their "
                           "collectives would not match): give every rank the same policy, "
                           "budget and options, shares of the same shape, and a cost model "
                           "that is the same on every rank (a GPU profile rather than "
                           "gpu='this-cpu')")
