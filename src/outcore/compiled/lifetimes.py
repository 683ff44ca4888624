"""Lifetimes of a compiled graph's forward outputs and tangents, as a training step holds them.

outcore's memory rule holds the step's outputs to the end of the step: for a whole captured
step those are the loss and the gradients. The joint graph Inductor partitions has other
outputs too: the *forward's* user-visible results (a language model's logits). The compiled
forward returns them to the caller, who computes the loss from them and drops them before
``loss.backward()`` runs the compiled backward; the backward graph holds them only when it
reads them (then they are saved like any activation). Held to the end of the step, a
vocabulary-sized logits tensor is counted through the whole backward, where it does not
exist: the planned backward peak is too high by its bytes, and a planner recomputes matrix
products to lower a peak the real step never reaches (GPT-2 at ``torch.compile``'s level:
1 MiB of logits at a 5.8 MiB step peak; session 11, helper 23).

``release_forward_outputs(graph)`` changes the graph outputs made in the forward that no
backward op reads into activations held until the forward ends: each is read, in name only,
by the first backward op, so the lowering frees it there (its bytes still count at the
forward/backward boundary, where the caller's loss holds it).

The tangents (the gradients of those outputs, the backward graph's inputs) are the mirror
image: outcore's rule holds them as static tensors from the step's start to its end, where
autograd hands them to the compiled backward when it starts and Inductor's backward frees
each after its last read. ``arrive_tangents_with_backward(graph)`` makes each tangent an
output of the first backward op (a gradient made there), so it is counted from the backward's
start and freed after its last read.

Together, at the first backward op the model holds what the caller holds when the backward
starts: the saved set, the outputs and their gradients; afterwards neither phantom is counted.
On GPT-2 (quick) the backward was planned 1.96 MiB too high, so the planner held its backward
peak down with recomputed matrix products while the real step's peak was at that boundary.

The caller's loss region (the ops between the compiled forward's return and the compiled
backward's start) is not in the graph, but its memory is, at that boundary, the step's:
a cross-entropy keeps its log-softmax (a tensor like the logits) for its backward, which
makes that tensor's gradient and then the logits' (the tangent). At the boundary the real
step holds the saved set + log-softmax + its gradient + the tangent: three tensors like the
logits (GPT-2 quick, helper 23's allocator timeline: forward end 3.79 MiB, loss backward 5.74,
0.98 MiB logits). The released output stands for the log-softmax and the tangent for itself;
``hold_loss_at_boundary(graph, released)`` adds the third as kernel temporaries of the first
backward op (``op.temporaries``: held during that op's Compute only), one released output's
bytes per released storage, and ``LOSS_SCALAR_BYTES`` for the loss's scalars (the loss,
a cross-entropy's saved total weight, the backward's seed: the quick GPT's allocator peak at
the boundary was 8 bytes above the three logits-sized tensors, session 12). Without it the
plan's boundary was one logits too low, so the
measured peak of a plan whose real peak is there did not follow the budget. It models a loss
that keeps one output-sized tensor and makes its gradient (cross-entropy, mean-squared
error); for a loss that keeps less (``out.sum()``) the boundary is planned too high, never
too low.

Two scalars outlive the boundary: the loss, which the caller holds to call ``backward()`` on
it, and the backward's seed (``torch.autograd.backward`` makes ``ones_like(loss)`` and holds it
until the backward returns). Both are held to the step's end (allocator timeline of the tiny
GPT of ``tests/compiled``, whole step compiled, session 15: 8 B above the plan at a backward
peak). A one-element forward output (a loss computed inside the graph) is therefore not
released and a one-element tangent (its seed) not moved: the rule holds them to the end (the
seed from the step's start, a few bytes too early). A loss computed outside the graph is
not in it: ``hold_loss_at_boundary`` adds ``LOSS_HELD_BYTES`` (the loss and the seed) as
temporaries of every backward op after the first as well.

``as_in_a_training_step(graph)`` applies the three, in order.

Invariants: only outputs made by a forward op are changed, and only when no backward op
reads them or any tensor sharing their storage; an output that is a view is released only
when its base is not an output the rule keeps; a graph with no backward op is unchanged.
A tangent is changed only when
it is a base (not a view) and the first backward op precedes every op that reads it. "The
first backward op" is the first after the last forward op (the boundary; the graph stays in
order when a backward op stands among the forward ones). Its added inputs and
outputs are bookkeeping for the memory rule only: its flops,
bytes touched and the FX graphs partitioned from the plan are unchanged.
"""

from __future__ import annotations

import math

from outcore.graph.ir import Graph, Op, Phase, TensorKind

#: The caller's loss scalars held at the boundary (module docstring): three 8-byte scalars.
LOSS_SCALAR_BYTES = 3 * 8
#: Those held through the whole backward (module docstring): the loss and its seed.
LOSS_HELD_BYTES = 2 * 8


def _one_element(graph: Graph, tid: int) -> bool:
    """Whether tensor ``tid`` has exactly one element (a loss, or a loss's seed)."""
    return math.prod(graph.tensors[tid].shape) == 1


def _first_backward(graph: Graph) -> Op | None:
    """The boundary: the first backward op after the graph's last forward op (None in a graph
    without one). A joint graph's order may put a backward op among the forward ones (a
    ResNet's ``squeeze`` of the loss's gradient before the classifier's ``addmm``, session
    15): read there, a released output would be read before it is made."""
    last = max((op.id for op in graph.ops if op.phase is Phase.FORWARD), default=-1)
    return next((op for op in graph.ops if op.phase is Phase.BACKWARD and op.id > last),
                None)


def release_forward_outputs(graph: Graph) -> list[int]:
    """Release ``graph``'s forward outputs at the forward's end (module docstring); returns
    the released tensor ids, in ``graph.outputs`` order. Mutates ``graph``."""
    first = _first_backward(graph)
    if first is None:
        return []
    read_back = {graph.tensors[t].storage for op in graph.ops
                 if op.phase is Phase.BACKWARD for t in op.inputs}
    released = []
    for tid in graph.outputs:
        t = graph.tensors[tid]
        if (t.producer is None or graph.ops[t.producer].phase is not Phase.FORWARD
                or t.storage in read_back or _one_element(graph, tid)):
            continue
        released.append(tid)
    if not released:
        return []
    kept = set(graph.outputs) - set(released)
    released = [t for t in released if graph.tensors[t].storage not in kept]
    for tid in released:
        graph.tensors[tid].kind = TensorKind.ACTIVATION
        if tid not in first.inputs:
            first.inputs.append(tid)
            graph.tensors[tid].consumers.append(first.id)
    gone = set(released)
    graph.outputs = [t for t in graph.outputs if t not in gone]
    return released


def arrive_tangents_with_backward(graph: Graph) -> list[int]:
    """Make each base tangent an output of the first backward op (module docstring), first
    among its outputs: that op is often a view of the tangent (``view(tangents_1)``), and a
    base made after its view would count as a re-made storage, its bytes twice. Returns the
    changed tensor ids. Mutates ``graph``."""
    first = _first_backward(graph)
    if first is None:
        return []
    changed = []
    for t in graph.tensors:
        if (t.kind is not TensorKind.TANGENT or t.is_view or t.producer is not None
                or _one_element(graph, t.id)):
            continue
        if any(c < first.id for c in t.consumers) or t.id in graph.outputs:
            continue
        if t.id in first.inputs:
            first.inputs.remove(t.id)
            t.consumers = [c for c in t.consumers if c != first.id]
        t.kind, t.producer = TensorKind.GRADIENT, first.id
        first.outputs.insert(0, t.id)
        changed.append(t.id)
    return changed


def hold_loss_at_boundary(graph: Graph, released: list[int]) -> int:
    """Add the caller's loss gradient and scalars at the boundary (module docstring): the
    bytes of each distinct storage among ``released`` (``release_forward_outputs``' result)
    and ``LOSS_SCALAR_BYTES`` become kernel temporaries of the first backward op, and
    ``LOSS_HELD_BYTES`` of every later backward op; returns the bytes added at the first.
    Mutates ``graph``."""
    first = _first_backward(graph)
    if first is None or not released:
        return 0
    storages = {graph.tensors[t].storage for t in released}
    added = sum(graph.tensors[s].nbytes for s in storages) + LOSS_SCALAR_BYTES
    first.temporaries += added
    for op in graph.ops:
        if op.phase is Phase.BACKWARD and op.id != first.id:
            op.temporaries += LOSS_HELD_BYTES
    return added


def as_in_a_training_step(graph: Graph) -> None:
    """Forward outputs, tangents and the caller's loss memory as a training step holds them
    (module docstring). Mutates ``graph``."""
    released = release_forward_outputs(graph)
    arrive_tangents_with_backward(graph)
    hold_loss_at_boundary(graph, released)
