"""All-reduce of gradient buckets from inside the executor, as backward makes them final.

``BucketReducer`` is the executor's ``GradHook`` on a data-parallel rank. The buckets come
from ``outcore.plan.grad_buckets.assign_buckets`` (same graph and plan on every rank, so
every rank issues the same collectives in the same order). During the step:

* ``ready(tid, value)``: the generated code calls it right after the Compute that makes
  gradient ``tid``. When a bucket's last gradient arrives and every earlier bucket has
  started (buckets start in index order on every rank, as DDP's: a plan of another batch
  shape may make them in another order, ``outcore.distributed.layout``), a flat buffer of
  the bucket's bytes is allocated (inside the measured step: it is counted, and the memory
  rule counts it too), the gradients are copied in, divided by the world size (division by
  a power of two is exact), and an asynchronous ``all_reduce`` (sum) is started. The rest
  of backward runs while it is in flight (gloo runs it on its own threads; nccl on its
  stream);
* a tied parameter (``tied``: groups of gradient ids of one parameter) has one slot, under
  the member the bucket lists; its contributions are summed into the slot in the order
  they arrive (autograd sums a leaf's contributions in its input buffer before
  AccumulateGrad, and DDP copies that ``.grad``); the other members are ``folded`` and must
  not be applied (``DataParallelTrainer`` drops them);
* with ``prior`` (gradient accumulation: ``.grad`` already held a gradient, which the
  trainer took out), the slot holds ``gradient + prior`` before the division, as DDP
  all-reduces the ``.grad`` autograd accumulated: ``.grad`` ends as the average of the
  ranks' accumulated gradients, bit for bit DDP's (not the prior plus the average);
* ``finish(outputs)``: after the schedule, waits for every bucket in order and hands the
  averaged gradients out as views of the buffers (``outputs[tid]``), which the executor
  then accumulates into ``.grad`` as for one device;
* a failed collective raises ``DistributedError`` naming the rank that failed (if it said
  so, see ``group.RankContext``); a failed step (``abort``) reports itself to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from outcore.distributed.group import RankContext
from outcore.graph.ir import Graph
from outcore.plan.grad_buckets import GradBucket


class BucketReducer:
    """The GradHook of one data-parallel rank (module doc)."""

    def __init__(self, graph: Graph, buckets: list[GradBucket], ctx: RankContext,
                 tied: Sequence[Sequence[int]] = ()) -> None:
        self.ctx = ctx
        self.buckets = buckets
        slots = {t for b in buckets for t in b.tensors}
        #: slot gradient id -> every gradient id summed into it (itself, tied members)
        self._members: dict[int, tuple[int, ...]] = {t: (t,) for t in slots}
        for group in tied:
            held = [t for t in group if t in slots]
            if held:
                self._members[held[0]] = tuple(group)
        #: gradients summed into another's slot: their outputs must not be applied
        self.folded = frozenset(t for s, m in self._members.items() for t in m if t != s)
        self._slot_of = {t: s for s, m in self._members.items() for t in m}
        self.tensors = frozenset(self._slot_of)
        self._bucket_of = {t: b.index for b in buckets for t in b.tensors}
        self._shapes = {t: graph.tensors[t].shape for t in slots}
        self._values: list[dict[int, list[torch.Tensor]]] = [{} for _ in buckets]
        self._flat: list[torch.Tensor | None] = [None] * len(buckets)
        self._works: list[Any] = [None] * len(buckets)
        self._complete = [False] * len(buckets)
        self._next = 0  # the first bucket not started
        #: slot gradient id -> the ``.grad`` this step accumulates onto (set by the trainer)
        self.prior: dict[int, torch.Tensor] = {}

    def begin(self) -> None:
        for values in self._values:
            values.clear()
        self._flat = [None] * len(self.buckets)
        self._works = [None] * len(self.buckets)
        self._complete = [False] * len(self.buckets)
        self._next = 0

    def ready(self, tid: int, value: torch.Tensor) -> None:
        slot = self._slot_of[tid]
        b = self._bucket_of[slot]
        values = self._values[b]
        values.setdefault(slot, []).append(value)
        done = all(len(values.get(s, ())) == len(self._members[s])
                   for s in self.buckets[b].tensors)
        if not done:
            return
        self._complete[b] = True
        while self._next < len(self.buckets) and self._complete[self._next]:
            self._launch(self.buckets[self._next], self._values[self._next])
            self._next += 1

    def _launch(self, bucket: GradBucket, values: dict[int, list[torch.Tensor]]) -> None:
        first = values[bucket.tensors[0]][0]
        flat = torch.empty(bucket.numel, dtype=first.dtype, device=first.device)
        for tid, offset in zip(bucket.tensors, bucket.offsets, strict=True):
            parts = values[tid]
            into = flat[offset:offset + parts[0].numel()].view(parts[0].shape)
            into.copy_(parts[0])
            for part in parts[1:]:  # a tied parameter's contributions, in arrival order
                into.add_(part)
            prior = self.prior.get(tid)
            if prior is not None:  # as autograd accumulates before DDP copies .grad
                into.add_(prior)
        values.clear()  # the buffer holds them now; the step's own references remain
        if self.ctx.world_size > 1:
            flat.div_(self.ctx.world_size)
            try:
                work = dist.all_reduce(flat, group=self.ctx.group, async_op=True)
            except RuntimeError as exc:
                raise self.ctx.error(f"the all-reduce of gradient bucket {bucket.index}",
                                     exc) from exc
            self._works[bucket.index] = work
        self._flat[bucket.index] = flat

    def finish(self, outputs: dict[int, torch.Tensor]) -> None:
        for bucket in self.buckets:
            flat = self._flat[bucket.index]
            if flat is None:
                raise RuntimeError(f"gradient bucket {bucket.index} never became ready: the "
                                   "schedule did not make all its gradients")
            work = self._works[bucket.index]
            if work is not None:
                try:
                    work.wait()
                except RuntimeError as exc:
                    raise self.ctx.error(f"the all-reduce of gradient bucket {bucket.index}",
                                         exc) from exc
            for tid, offset in zip(bucket.tensors, bucket.offsets, strict=True):
                shape = self._shapes[tid]
                n = outputs[tid].numel()
                outputs[tid] = flat[offset:offset + n].view(shape)
        self._flat = [None] * len(self.buckets)
        self._works = [None] * len(self.buckets)

    def abort(self, error: BaseException) -> None:
        from outcore.distributed.group import DistributedError

        if not isinstance(error, DistributedError):
            self.ctx.report_failure(error)
        self._flat = [None] * len(self.buckets)
        self._works = [None] * len(self.buckets)
