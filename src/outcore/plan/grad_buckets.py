"""Gradient buckets of a data-parallel step, and their memory: an ADDITIVE term to the rule.

Plain Python (no torch). The memory rule of a Schedule (``outcore.plan.residency``) is left
as it is; a data-parallel step adds, on top of it, one flat buffer per gradient bucket:

* the parameter gradients (tensors whose ``source`` starts with ``"grad:"``) are taken in
  the order the schedule makes them (the instruction that first makes each one resident:
  that is when it is *final*, since gradients are outputs of the step and never freed or
  recomputed), and grouped, in that order, into buckets of one dtype of at most
  ``cap_bytes`` each (a gradient larger than the cap gets a bucket of its own);
* a tied parameter (one parameter under two names, an LM head sharing the embedding's
  weight) has one gradient output per name; given as a ``tied`` group (from the model,
  ``tied_gradients`` of ``outcore.distributed.layout.tied_names``, or from the graph alone,
  ``graph_tied_gradients``) it takes one slot,
  under the member the schedule makes last (the parameter's gradient is final when all its
  contributions are: the runtime sums them into that slot, as autograd sums them before
  DDP copies ``.grad`` into its bucket);
* a bucket is *ready* after the instruction that makes its last gradient; the runtime then
  allocates its flat buffer (the bucket's bytes: its gradients' elements times their item
  size), copies the gradients in and starts the all-reduce. The buffer lives until the step
  ends (the averaged gradients are handed out as views of it), so it is never released
  inside the step.

So after instruction ``i`` the device holds the rule's bytes plus the bytes of the buckets
ready at or before ``i``; during instruction ``i`` (its transients included) the buckets
ready *before* ``i``. ``peak_with_buckets`` is the max of both, exactly what the executor's
tracker measures on a rank (tested in ``tests/distributed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from outcore.graph.dtypes import itemsize
from outcore.graph.ir import Graph
from outcore.plan.residency import residency_steps
from outcore.plan.schedule import Compute, Prefetch, Schedule

#: DDP's default bucket size (25 MiB).
DEFAULT_BUCKET_CAP = 25 * 1024 * 1024

@dataclass(frozen=True)
class GradBucket:
    """One bucket: its gradient tensor ids (in the order they become final), the element
    offset of each in the flat buffer, the buffer's bytes, dtype, and ``ready_at``: the
    instruction after which all of them are final."""

    index: int
    tensors: tuple[int, ...]
    offsets: tuple[int, ...]
    numel: int
    nbytes: int
    dtype: str
    ready_at: int


def gradient_tensors(graph: Graph) -> list[int]:
    """Ids of the parameter gradients the step outputs (``source`` ``"grad:<param>"``)."""
    return [t.id for t in graph.tensors if t.source.startswith("grad:")]


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def final_at(graph: Graph, schedule: Schedule) -> dict[int, int]:
    """Gradient id -> index of the instruction that first makes it resident (its final
    value: a gradient is never freed, offloaded or recomputed inside a valid step)."""
    wanted = set(gradient_tensors(graph))
    out: dict[int, int] = {}
    for i, ins in enumerate(schedule.instructions):
        if isinstance(ins, Compute):
            made = graph.ops[ins.op].outputs
        elif isinstance(ins, Prefetch):
            made = [ins.tensor]
        else:
            continue
        for tid in made:
            if tid in wanted and tid not in out:
                out[tid] = i
    missing = wanted - set(out)
    if missing:
        names = sorted(graph.tensors[t].name for t in missing)
        raise ValueError(f"gradients {names} are never made by the schedule; a data-parallel "
                         "step needs every parameter gradient as an output of the step")
    return out


def tied_gradients(graph: Graph, tied: Sequence[Sequence[str]]) -> list[tuple[int, ...]]:
    """``tied`` (groups of parameter names) as groups of ``graph``'s gradient ids."""
    from outcore.plan.weights import gradients

    grads = gradients(graph)
    return [tuple(grads[n] for n in group if n in grads) for group in tied]


def graph_tied_gradients(graph: Graph) -> list[tuple[int, ...]]:
    """The ``tied`` groups of ``graph`` as gradient ids, read off the graph itself
    (``outcore.plan.weights.tied_parameters``): what ``tied_gradients(graph,
    outcore.distributed.layout.tied_names(model))`` gives from the model, for callers that
    have only the graph (the simulator, ``outcore plan --gpus``)."""
    from outcore.plan.weights import tied_parameters

    return [g for g in tied_gradients(graph, tied_parameters(graph)) if len(g) > 1]


def fold_tied(ready: dict[int, int], tied: Sequence[Sequence[int]]) -> dict[int, tuple[int, ...]]:
    """Per tied group of at least two gradients in ``ready`` (gradient id -> the instruction
    making it final): the member made last (ties: the larger id), which holds the group's
    slot, -> the other members, folded into it."""
    out: dict[int, tuple[int, ...]] = {}
    for group in tied:
        members = [t for t in group if t in ready]
        if len(members) < 2:
            continue
        last = max(members, key=lambda t: (ready[t], t))
        out[last] = tuple(t for t in members if t != last)
    return out


def assign_buckets(graph: Graph, schedule: Schedule, cap_bytes: int = DEFAULT_BUCKET_CAP,
                   tied: Sequence[Sequence[int]] = ()) -> list[GradBucket]:
    """Group the gradients into buckets (module doc); deterministic for a graph+schedule, so
    every rank running the same plan issues the same collectives in the same order.
    ``tied``: groups of gradient ids of one parameter; each group is one slot, under its
    member made last (``fold_tied``)."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket cap must be > 0 bytes, got {cap_bytes}")
    ready = final_at(graph, schedule)
    for folded in fold_tied(ready, tied).values():
        for tid in folded:
            del ready[tid]
    order = sorted(ready, key=lambda t: (ready[t], t))
    buckets: list[GradBucket] = []
    members: list[int] = []

    def close() -> None:
        if not members:
            return
        dtype = graph.tensors[members[0]].dtype.removeprefix("torch.")
        offsets, numel = [], 0
        for tid in members:
            offsets.append(numel)
            numel += _numel(graph.tensors[tid].shape)
        buckets.append(GradBucket(len(buckets), tuple(members), tuple(offsets), numel,
                                  numel * itemsize(dtype), dtype,
                                  max(ready[t] for t in members)))
        members.clear()

    size = 0
    for tid in order:
        t = graph.tensors[tid]
        nbytes = _numel(t.shape) * itemsize(t.dtype)
        same = not members or graph.tensors[members[0]].dtype == t.dtype
        if members and (not same or size + nbytes > cap_bytes):
            close()
            size = 0
        members.append(tid)
        size += nbytes
    close()
    return buckets


def bucket_bytes_after(buckets: Sequence[GradBucket], n_instructions: int) -> list[int]:
    """Bucket bytes held after each instruction (cumulative: buffers live to the end)."""
    extra = [0] * n_instructions
    for b in buckets:
        extra[b.ready_at] += b.nbytes
    acc = 0
    for i in range(n_instructions):
        acc += extra[i]
        extra[i] = acc
    return extra


def peak_with_buckets(graph: Graph, schedule: Schedule, buckets: Sequence[GradBucket],
                      workspace: Callable[[int], int] | None = None) -> int:
    """Peak device bytes of ``schedule`` on one data-parallel rank: the rule's curve plus
    the bucket buffers (module doc)."""
    after = bucket_bytes_after(buckets, len(schedule.instructions))
    steps = residency_steps(graph, schedule, workspace)
    peak = next(steps).device
    before = 0
    for step in steps:
        i = step.at
        peak = max(peak, step.device + before, step.device - step.transient + after[i])
        before = after[i]
    return peak


def total_bucket_bytes(buckets: Sequence[GradBucket]) -> int:
    """Bytes of every bucket buffer (what a rank holds at the end of its step)."""
    return sum(b.nbytes for b in buckets)
