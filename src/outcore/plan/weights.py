"""Parameters and gradients held in host memory, planned in the one Schedule (plain Python).

A ``WeightPlacement`` names the parameters that live in host memory between steps and the
gradients that are sent to host memory as soon as backward has produced them. ``lower``
(``outcore.plan.lower``, its ``weights`` argument) turns it into ordinary instructions of the
Schedule, through the same machinery as offloaded activations:

* a held parameter is not resident when the step starts (``Schedule.host_static``: the
  replay counts it in host memory, with a completed host copy). Before its first use in
  forward it is brought in by ``Prefetch`` + ``Wait(h2d)`` and freed after its last forward
  use; backward brings it in again before its first backward use (or before the recompute
  of a view of it, e.g. the transpose a linear layer reads) and frees it after the last.
  Both prefetches are hoisted into the window of the previous heavy compute, as
  activations' are, so they run on the copy engine while the previous layer computes;
* a sent gradient's storage is offloaded (``Offload``) right after the op that makes the
  gradient, and its device memory freed after ``Wait(d2h)``; the Wait and the Free are
  sunk below the next heavy compute (``sink_gradient_frees``) so the copy overlaps it. The
  gradient ends the step in host memory (``Schedule.host_outputs``), where the executor
  reads it back (a view of the host copy of its storage).

Invariants: a held parameter is a base PARAMETER; a sent gradient is a step output of kind
GRADIENT; the schedule carries both lists so the replay (memory rule, verifier,
simulator, codegen) accounts for every byte, host bytes included.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from outcore.errors import ScheduleError
from outcore.graph.ir import Graph, OpCategory, TensorKind
from outcore.plan.schedule import Compute, Free, Instruction, Wait

HEAVY = frozenset({OpCategory.CONV, OpCategory.MATMUL, OpCategory.ATTENTION})
GRAD_PREFIX = "grad:"


@dataclass(frozen=True)
class WeightPlacement:
    """Which parameters are held in host memory and which gradients are sent there.

    ``params``: parameter tensor ids (base tensors of kind PARAMETER). ``grads``: gradient
    tensor ids among the graph's outputs. Build it with ``WeightPlacement.of``.
    """

    params: frozenset[int] = field(default_factory=frozenset)
    grads: frozenset[int] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.params or self.grads)

    @classmethod
    def of(cls, graph: Graph, names: Iterable[str], *, grads: bool = True) -> WeightPlacement:
        """Hold the parameters called ``names`` (``model.``-prefixed or not, as
        ``named_parameters`` spells them) on the host and, with ``grads``, send their
        gradients there. Raises ScheduleError naming an unknown parameter."""
        wanted = {n.removeprefix("model.") for n in names}
        params = parameters(graph)
        unknown = wanted - set(params)
        if unknown:
            known = ", ".join(sorted(params)[:8])
            raise ScheduleError(f"no parameter called {sorted(unknown)[0]!r} in graph "
                                f"{graph.name!r} (parameters are named like {known}, ...)")
        held = frozenset(params[n] for n in wanted)
        sent = frozenset(gradients(graph)[n] for n in wanted
                         if n in gradients(graph)) if grads else frozenset()
        return cls(held, sent)

    def check(self, graph: Graph) -> None:
        """Raise ScheduleError when a held tensor is not a base parameter or a sent one is
        not a gradient output."""
        outputs = set(graph.outputs)
        for tid in self.params:
            t = graph.tensors[tid]
            if t.kind is not TensorKind.PARAMETER or t.is_view:
                raise ScheduleError(f"only parameters can be held in host memory; "
                                    f"{t.name!r} is a {t.kind}")
        for tid in self.grads:
            t = graph.tensors[tid]
            if t.kind is not TensorKind.GRADIENT or tid not in outputs:
                raise ScheduleError(f"only the step's gradients can be sent to host memory; "
                                    f"{t.name!r} is a {t.kind}")

    def movable(self, graph: Graph) -> frozenset[int]:
        """The tensors whose last residency ends in a Free although the step keeps them:
        held parameters, sent gradients and their storages."""
        bases = {graph.tensors[g].storage for g in self.grads}
        return self.params | self.grads | frozenset(bases)


def parameters(graph: Graph) -> dict[str, int]:
    """Parameter name (without ``model.``) -> its tensor id."""
    return {t.source.removeprefix("model."): t.id for t in graph.tensors
            if t.kind is TensorKind.PARAMETER and not t.is_view}


def tied_parameters(graph: Graph) -> list[tuple[str, ...]]:
    """Groups of parameter names (without ``model.``) bound to one parameter: tied weights,
    such as an LM head sharing the embedding's weight. Capture gives each name its own
    PARAMETER tensor, the later names views of the first name's storage; a group is the
    parameter tensors sharing one storage with the base's shape and dtype (the first
    name first), for storages with two names or more. The graph's own account of what
    ``outcore.distributed.layout.tied_names`` reads off the model."""
    groups: dict[int, list[str]] = {}
    for t in graph.tensors:
        if t.kind is not TensorKind.PARAMETER or not t.source:
            continue
        base = graph.tensors[t.storage]
        if (base.kind is TensorKind.PARAMETER and base.shape == t.shape
                and base.dtype == t.dtype):
            groups.setdefault(base.id, []).append(t.source.removeprefix("model."))
    return [tuple(names) for names in groups.values() if len(names) > 1]


def gradients(graph: Graph) -> dict[str, int]:
    """Parameter name (without ``model.``) -> the id of its gradient output."""
    outputs = set(graph.outputs)
    return {t.source.removeprefix(GRAD_PREFIX).removeprefix("model."): t.id
            for t in graph.tensors
            if t.kind is TensorKind.GRADIENT and t.id in outputs
            and t.source.startswith(GRAD_PREFIX)}


def weight_bytes(graph: Graph, placement: WeightPlacement) -> int:
    """Bytes of the held parameters (what the host holds for them between steps)."""
    return sum(graph.tensors[t].nbytes for t in placement.params)


def sink_gradient_frees(graph: Graph, seq: list[Instruction], placement: WeightPlacement
                        ) -> list[Instruction]:
    """Move each sent gradient storage's ``Wait(d2h)`` + ``Free`` from right after its
    Offload to right after the next heavy Compute (the copy overlaps that compute); left in
    place when no heavy compute follows. Nothing between reads or redefines that storage
    (a gradient is made once and read by no later op), so the move keeps the schedule sound.
    """
    bases = {graph.tensors[g].storage for g in placement.grads}
    out: list[Instruction] = []
    held: list[Instruction] = []
    i = 0
    while i < len(seq):
        ins = seq[i]
        nxt = seq[i + 1] if i + 1 < len(seq) else None
        if (isinstance(ins, Wait) and ins.direction == "d2h" and ins.tensor in bases
                and isinstance(nxt, Free) and nxt.tensor == ins.tensor):
            held += [ins, nxt]
            i += 2
            continue
        out.append(ins)
        if held and isinstance(ins, Compute) and graph.ops[ins.op].category in HEAVY:
            out += held
            held = []
        i += 1
    return out + held
