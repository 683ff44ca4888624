"""What a budget bounds: the whole step, or the activations only (plain Python).

``outcore.plan(graph, budget, scope=...)``:

* ``"step"`` (the default): at every instruction, the device bytes the memory rule
  (``outcore.plan.residency``) counts: everything, parameters and gradients included. This is
  what must fit on the device.
* ``"activations"``: the same bytes **less** the *scoped-out storages*: the parameters,
  buffers and inputs (``SCOPED_OUT_KINDS``) and the parameters' gradients
  (``parameter_gradients``: GRADIENT tensors among the step's outputs whose source is
  ``"grad:"`` and a parameter's or an input's source, and the storages they live in; in
  Inductor's joint graph parameters are plain inputs). Activations, their gradients,
  kernel temporaries, workspaces, recomputes' duplicates and saved RNG states stay in, and
  so do tangents: the loss seed is made inside the step (by ``loss.backward()`` and by
  outcore's executor alike), so the allocator counts it. This is the measure of PyTorch's
  ``activation_memory_budget`` and of ``benchmarks/vs_pytorch.py --match activation``
  (the CPU allocator's bytes over the step, the ``.grad`` storages left out), which an
  activation-scoped plan's ``scoped_peak`` bounds once kernel temporaries are measured.

An activation-scoped plan is made on a *scoped copy* of the graph (``scoped_copy``): the same
tensors and ops, with every scoped-out storage carrying 0 bytes, every policy unchanged. A
kernel may build its result in scratch and allocate the result after (the CPU's convolution
backward holds a weight-gradient-sized buffer, then allocates the gradient: resnet20-cifar's
executor step measured 4,608 B above a scope that left both out, session 15); so an op that
makes a parameter's gradient is charged, in the copy, its measured scratch
(``SCRATCH``, when ``measure_temporaries`` ran on the CPU)
instead of its temporaries, or, unmeasured, its temporaries plus the gradient's bytes. The
schedule is then attached to the real graph. Invariant (the memory rule counts a storage's
bytes while it is resident, a transient only for a recomputed or re-made output, which a
scoped-out storage never is, and an op's temporaries during its Compute): at every
instruction, the copy's device bytes equal the real graph's less the bytes of the scoped-out
storages resident there, plus, at a Compute of an op that makes a parameter's gradient, what
the copy charges that op beyond its temporaries (``scoped_curve``).
"""

from __future__ import annotations

import copy
from dataclasses import replace

from outcore.errors import InvalidArgumentError
from outcore.graph.ir import Graph, TensorKind
from outcore.plan.memory import MemoryTrace, memory_curve
from outcore.plan.schedule import Schedule

STEP = "step"
ACTIVATIONS = "activations"
SCOPES = (STEP, ACTIVATIONS)
#: ``Graph.meta`` key marking a scoped copy (its value: the scope)
SCOPED = "_outcore_scope"
_GRAD = "grad:"
#: ``graph.meta`` key of each op's *scratch* on the CPU (a list, one int per op, written by
#: ``outcore.cost.measure_temporaries``): the most bytes its call held at once that it freed
#: again before returning, whatever it had already returned. An activation-scoped plan
#: charges the larger of it and the op's temporaries on an op whose result is left out of
#: the scope (module doc).
SCRATCH = "op_scratch"
#: Kinds whose storages an activation-scoped budget leaves out (with the parameters'
#: gradients): what the step finds allocated when it starts. Tangents stay in (module doc).
SCOPED_OUT_KINDS = frozenset({TensorKind.PARAMETER, TensorKind.BUFFER, TensorKind.INPUT})


def check_scope(scope: str) -> str:
    """``scope`` when it is one of ``SCOPES``; InvalidArgumentError otherwise."""
    if scope not in SCOPES:
        raise InvalidArgumentError(scope, "a scope: " + " or ".join(map(repr, SCOPES)),
                                   "'step' bounds every byte of the step, 'activations' "
                                   "leaves out parameters, buffers, inputs and the "
                                   "parameters' gradients.")
    return scope


def parameter_gradients(graph: Graph) -> list[int]:
    """Ids of the step's outputs that are a parameter's gradient: GRADIENT tensors among
    ``graph.outputs`` whose source is ``"grad:"`` followed by the source of a PARAMETER or
    INPUT tensor (Inductor's joint graph takes parameters as plain inputs, ``input:<i>``;
    the gradient of a batch input that asks for one is left out too)."""
    params = {t.source for t in graph.tensors
              if t.kind in (TensorKind.PARAMETER, TensorKind.INPUT) and t.source}
    found = []
    for tid in dict.fromkeys(graph.outputs):
        t = graph.tensors[tid]
        if t.kind is TensorKind.GRADIENT and t.source.startswith(_GRAD) \
                and t.source[len(_GRAD):] in params:
            found.append(tid)
    return found


def scoped_out(graph: Graph) -> frozenset[int]:
    """The storages an activation-scoped budget leaves out (module doc): those of the
    parameters, buffers and inputs and of the parameters' gradients."""
    static = {t.storage for t in graph.tensors if t.kind in SCOPED_OUT_KINDS}
    grads = {graph.tensors[g].storage for g in parameter_gradients(graph)}
    return frozenset(static | grads)


def scoped_copy(graph: Graph) -> Graph:
    """A copy of ``graph`` whose scoped-out storages (``scoped_out``) carry 0 bytes; ops,
    outputs, meta and ``source`` as the original's (ops copied, so a policy that writes on
    them leaves the original alone). ``meta[SCOPED]`` marks it."""
    out = scoped_out(graph)
    tensors = [replace(t, nbytes=0, consumers=list(t.consumers)) if t.id in out
               else replace(t, consumers=list(t.consumers)) for t in graph.tensors]
    ops = [copy.deepcopy(op) for op in graph.ops]
    found = graph.meta.get(SCRATCH)
    scratch: list[int] = found if isinstance(found, list) else []
    measured = len(scratch) == len(ops)
    for g in dict.fromkeys(graph.tensors[t].storage for t in parameter_gradients(graph)):
        made_by = graph.tensors[g].producer
        if made_by is None:
            continue
        if measured:  # the kernel's measured scratch (module doc)
            ops[made_by].temporaries = max(ops[made_by].temporaries, int(scratch[made_by]))
        else:  # not measured: the kernel may hold the gradient's bytes as scratch
            ops[made_by].temporaries += graph.tensors[g].nbytes
    meta = {k: v for k, v in graph.meta.items() if not k.startswith("_outcore_lowest")}
    meta[SCOPED] = ACTIVATIONS
    return Graph(tensors, ops, list(graph.outputs), name=graph.name, meta=meta,
                 source=graph.source)


def scoped_curve(graph: Graph, schedule: Schedule) -> MemoryTrace:
    """The memory rule's curve of ``schedule`` on ``graph`` with the scoped-out storages
    left out (module doc): what an activation-scoped budget bounds at each instruction."""
    return memory_curve(scoped_copy(graph), schedule)


def scope_words(scope: str) -> str:
    """What a budget of ``scope`` bounds, for messages and reports."""
    if scope == ACTIVATIONS:
        return ("activations only (scope='activations': parameters, buffers, inputs and "
                "the parameters' gradients left out)")
    return "the whole step (scope='step': parameters and gradients included)"
