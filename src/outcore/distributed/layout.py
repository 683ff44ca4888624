"""A rank's gradient buckets by parameter: the same for every batch shape the rank plans.

Every rank must issue the same all-reduces in the same order whatever the shape of its
share (the smaller last batch, or an uneven split such as 10 samples over 4 ranks: 3, 3,
2, 2), as DDP's buckets are fixed by the parameters, not by the batch. So:

* the buckets of the rank's first plan (``outcore.plan.grad_buckets.assign_buckets``)
  become a ``BucketLayout``: per bucket, its slots, each slot one parameter (a tied
  parameter once, under all its names), with the first plan's offsets, sizes and dtype;
* a plan of another shape gets the same buckets (``BucketLayout.buckets``), holding its own
  gradient ids; each slot under its parameter's gradient that this plan makes last;
* ``ready_at`` is the running maximum over the buckets in order: the reducer starts the
  all-reduces in bucket order (``outcore.distributed.reducer``), so a bucket whose
  gradients are made before an earlier bucket's waits for it, and its buffer is allocated
  then (what ``peak_with_buckets`` counts).

``tied_names(model)``: the names that share one ``nn.Parameter`` (groups of two or more),
the groups ``assign_buckets`` and the reducer fold into one slot
(``outcore.plan.grad_buckets.tied_gradients``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from torch import nn

from outcore.graph.ir import Graph
from outcore.plan.grad_buckets import GradBucket, final_at
from outcore.plan.schedule import Schedule
from outcore.plan.weights import gradients


def tied_names(model: nn.Module) -> list[tuple[str, ...]]:
    """Groups of the parameter names (as ``named_parameters(remove_duplicate=False)``
    gives them) bound to one parameter, for parameters with two names or more."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [tuple(group) for group in names.values() if len(group) > 1]


@dataclass(frozen=True)
class BucketLayout:
    """The first plan's buckets by parameter (module doc): per bucket, per slot, the names
    of the slot's parameter (one name, or a tied parameter's names)."""

    first: tuple[GradBucket, ...]
    slots: tuple[tuple[tuple[str, ...], ...], ...]

    @classmethod
    def of(cls, graph: Graph, buckets: Sequence[GradBucket],
           tied: Sequence[Sequence[str]]) -> BucketLayout:
        """The layout of ``buckets``, assigned on ``graph`` with the ``tied`` groups."""
        name_of = {tid: name for name, tid in gradients(graph).items()}
        group_of = {n: tuple(group) for group in tied for n in group}
        slots = tuple(tuple(group_of.get(name_of[t], (name_of[t],)) for t in b.tensors)
                      for b in buckets)
        return cls(tuple(buckets), slots)

    def buckets(self, graph: Graph, schedule: Schedule) -> list[GradBucket]:
        """The same buckets for a plan of another shape (module doc). Raises ValueError
        when that graph lacks a parameter's gradient (it is not the same model's step)."""
        grads = gradients(graph)
        ready = final_at(graph, schedule)
        out: list[GradBucket] = []
        running = -1
        for bucket, slots in zip(self.first, self.slots, strict=True):
            tensors = []
            for names in slots:
                missing = [n for n in names if n not in grads]
                if missing:
                    raise ValueError(f"the step of this batch has no gradient for {missing}; "
                                     "every batch shape must train the same parameters")
                members = {grads[n]: ready[grads[n]] for n in names}
                last = max(members, key=lambda t: (members[t], t))
                tensors.append(last)
                running = max(running, *members.values())
            out.append(replace(bucket, tensors=tuple(tensors), ready_at=running))
        return out

