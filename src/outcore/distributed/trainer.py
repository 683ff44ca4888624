"""``DataParallelTrainer``: a Trainer whose step averages gradients over the ranks.

As with PyTorch's DistributedDataParallel:

* parameters and buffers are broadcast from rank 0 when the trainer is built, and buffers
  (e.g. BatchNorm running statistics) again before every step, so every rank starts each
  step from rank 0's; BatchNorm normalises with each rank's own batch statistics (as DDP
  without SyncBatchNorm), ``nn.SyncBatchNorm`` with the whole batch's over the ranks
  (``outcore.distributed.sync_bn``; its recomputes replay, ``outcore.distributed.replay``);
* the step's batch is used with its own storage, as it was captured
  (``outcore.capture.batching.own_storage``, in ``PlannedTrainer.step``);
* the first step compares the ranks' plans (``same_plan_everywhere``) before any other
  collective (at the first step, not when the trainer is built: ranks plan at their own
  speed, and a short group timeout must not end the slower one's planning);
* after ``step`` every rank's ``.grad`` holds the average over the ranks of their
  gradients (accumulated into ``.grad`` as ``loss.backward()`` does); the optimizer step
  stays the user's. Accumulating over steps, the average is of the accumulated ``.grad``
  (DDP all-reduces what autograd accumulated: ``(prior + g_r) / N`` summed, which rounds
  differently from ``prior + sum(g_r / N)``), so the bits equal DDP's;
* with one pass (``plan.sub_batches == 1``) the executor's ``BucketReducer`` all-reduces
  each bucket as backward makes it final (overlapped with the rest of backward); with
  sub-batches the gradients are final only after the last pass, so ``.grad`` is
  all-reduced then (moDNN's "gradient accumulation" at the end of the iteration);
* a step that raises on one rank is reported to the others (``RankContext``), whose next
  collective raises ``DistributedError`` naming that rank, at the latest after the group's
  timeout.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from outcore.distributed.group import DistributedError, RankContext
from outcore.distributed.reducer import BucketReducer
from outcore.distributed.replay import CollectiveReplay
from outcore.distributed.sync_bn import SyncBatchNormCollectiveError
from outcore.errors import OutcoreError
from outcore.plan.grad_buckets import GradBucket
from outcore.plan.weights import gradients
from outcore.planned import PlannedStep
from outcore.trainer import PlannedTrainer, refuse_no_grad


class DataParallelTrainer(PlannedTrainer):
    """A Trainer on one rank of a data-parallel group (module doc); built by
    ``outcore.compile(..., distributed=True)``."""

    def __init__(self, model: nn.Module, planned: PlannedStep, device: Any,
                 budget: int | None, ctx: RankContext, buckets: list[GradBucket]) -> None:
        reducer = None
        if planned.plan.sub_batches == 1 and ctx.world_size > 1:
            reducer = BucketReducer(planned.graph, buckets, ctx)
        self.replay = CollectiveReplay(planned.graph, planned.schedule)
        super().__init__(model, planned, device, budget, grad_hook=reducer,
                         impls=self.replay.impls)
        self.ctx = ctx
        self.buckets = buckets
        self.reducer: BucketReducer | None = reducer
        bucketed = reducer.tensors if reducer is not None else frozenset()
        #: parameter name -> its gradient's id, for the gradients the buckets all-reduce
        self._grad_ids = {n: t for n, t in gradients(planned.graph).items() if t in bucketed}
        self._plans_compared = False

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    def step(self, x: Any, y: Any) -> torch.Tensor:
        """One data-parallel step on this rank's ``(x, y)``; returns this rank's loss.
        Refused under ``torch.no_grad()`` before any collective (``refuse_no_grad``)."""
        refuse_no_grad()
        self.replay.reset()
        try:
            if not self._plans_compared:
                self._collective("the comparison of the ranks' plans", lambda: (
                    same_plan_everywhere(self.ctx, self.planned, self.buckets)))
                self._plans_compared = True
            self._collective("the broadcast of buffers from rank 0", self._sync_buffers)
            loss = self._accumulating_step(x, y)
            if self.reducer is None and self.ctx.world_size > 1:
                self._collective("the all-reduce of the accumulated gradients",
                                 self._allreduce_grads)
        except SyncBatchNormCollectiveError as exc:
            raise self.ctx.error("the all-reduce of a SyncBatchNorm's statistics",
                                 exc) from exc
        except DistributedError:
            raise
        except BaseException as exc:
            self.ctx.report_failure(exc)
            raise
        return loss

    def _accumulating_step(self, x: Any, y: Any) -> torch.Tensor:
        """``PlannedTrainer.step`` (which gives the batch its own storage), with the
        ``.grad`` already held by the bucketed parameters handed to the reducer: it
        all-reduces ``.grad + gradient`` as DDP does, and the result replaces ``.grad``.
        A failed step leaves every ``.grad`` as it was."""
        if self.reducer is None:
            return super().step(x, y)
        params = dict(self.model.named_parameters())
        taken: dict[str, torch.Tensor] = {}
        for name in self._grad_ids:
            grad = params[name].grad if name in params else None
            if grad is not None:
                taken[name] = grad
        for name in taken:
            params[name].grad = None
        self.reducer.prior = {self._grad_ids[n]: g for n, g in taken.items()}
        try:
            return super().step(x, y)
        except BaseException:
            for name, grad in taken.items():
                params[name].grad = grad
            raise
        finally:
            self.reducer.prior = {}

    def _collective(self, what: str, fn: Any) -> None:
        try:
            fn()
        except RuntimeError as exc:
            raise self.ctx.error(what, exc) from exc

    def _sync_buffers(self) -> None:
        broadcast_state(self.model, self.ctx, parameters=False)

    def _allreduce_grads(self) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is not None:
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
