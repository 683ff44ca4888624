"""A lower bound on the step time of every weights placement with its activation plan.

Plain Python (no torch). The joint problem: choose the set ``S`` of parameters held in
host memory (their gradients sent there, their optimizer state and step on the host) and an
activation plan, so that the step's device peak plus the optimizer state of the
device-held parameters fits ``budget``; minimise the simulated step plus the optimizer step
(``outcore.weights.spec.optimizer_seconds``). ``joint_lower_bound`` returns seconds no such
placement and plan beats. The argument, term by term, for any fitting ``S``:

* **Memory.** At the end of the step every device-held parameter is resident (a static
  tensor that is not held is never freed) and so is its gradient (a step output that is
  not sent ends on the device); the device-held optimizer state sits beside them. So
  ``sum over p not in S of (weight_p + grad_p + state_p) <= budget``, i.e. ``S`` frees at
  least ``need = total - budget`` of those bytes (``m_p = weight_p + grad_p + state_p``).
* **Memory while an op runs.** An op's inputs and outputs are on the device while it
  runs, beside every device-held weight (never freed) and the device-held state (outside
  the schedule, beside it all step). So for every op ``o``:
  ``sum over p not in S of (weight_p + state_p) + A_o <= budget``, where ``A_o`` is the
  bytes of ``o``'s input and output storages that are not parameters (activations, the
  batch, the gradients it writes). Holding ``p`` frees there at most ``state_p``, plus
  ``weight_p`` when ``o`` does not read ``p`` (a read weight is on the device during ``o``
  whether held or not). Each op gives one covering constraint like the end-of-step one
  (``op_needs``: per set of parameters read, the largest ``A_o``); ``S`` meets all of them,
  so each term below is at least its minimum under each constraint, and the bound takes
  the largest. This is what makes a bound see the activations' room: a batch whose
  largest op (the logits and their loss, at long sequences) leaves too little room beside
  the weights forces host-held parameters even where the weights alone fit.
* **Compute.** Every op of the graph runs at least once on the one compute stream, so the
  simulated step is at least the sum of the ops' times (each at its fastest variant; a
  recompute only adds).
* **Copies.** A held parameter that some op reads is not resident at the start, so it is
  prefetched at least once (``transfer_time(weight_p, "h2d")``); a sent gradient ends in
  host memory, so it is offloaded at least once (its storage, ``"d2h"``). A copy engine
  runs its copies one at a time and the step ends after the last copy, so the step is at
  least the busier engine's total (both directions' total when the profile has one engine).
* **Optimizer.** ``optimizer_seconds`` is non-decreasing in the host-held elements, so it
  is at least its value at the fewest elements any ``S`` freeing ``need`` bytes holds.

The step is at least ``max(compute, copies)`` plus the optimizer (the optimizer after the
pass, ``overlap=None``). With the optimizer overlapped with backward (``Overlap``: the
simulator's ``outcore.sim.host_steps`` timeline, the chooser's objective), the step is at
least each of: ``compute`` plus the device-held parameters' step (it runs on the compute
stream after the pass), the copies, and ``forward`` plus the host step (the CPU steps one
parameter at a time, each after its gradient, and every gradient is made by a backward op,
which the compute stream runs after every forward op, each at least once). Each term is minimised
over ``S`` separately, by the fractional relaxation of "hold enough bytes" (a covering
knapsack solved greedily, exact for the relaxation), which is below the minimum over the
integer ``S`` that the chooser searches (tied parameters, which stay on the device, are
never in ``S``). Every activation decision only adds time (it is
not modelled: at budgets that force recompute or offload of activations the gap includes
that cost). The bound covers placements whose gradients are sent exactly when their
parameter is held (the chooser's family).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from outcore.graph.ir import Graph, OpCategory, TensorKind
from outcore.plan.weights import gradients, parameters
from outcore.weights.spec import optimizer_seconds


@dataclass(frozen=True)
class ParamFacts:
    """One parameter: the device bytes holding it frees (``freed``: weight + gradient +
    state), its elements, and the seconds of its one prefetch and its gradient's one
    offload on the cost model (0 without one). ``holdable`` is False for a parameter that
    another parameter views (tied weights: the LM head reading the embedding): the
    lowering cannot hold those yet, so they stay on the device."""

    name: str
    tensor: int
    weight: int
    grad: int
    state: int
    numel: int
    h2d: float
    d2h: float
    holdable: bool = True

    @property
    def freed(self) -> int:
        return self.weight + self.grad + self.state


@dataclass(frozen=True)
class Overlap:
    """The optimizer step overlapped with the pass: its rates (parameters per second on the
    host and on the device) and ``forward``, seconds no schedule runs its first gradient
    before (the forward ops' fastest times)."""

    host_rate: float
    device_rate: float
    forward: float

    def seconds(self, compute: float, copies: float, host: float, device: float) -> float:
        """The module doc's overlapped bound at ``host``/``device`` optimizer elements."""
        return max(compute + device / self.device_rate, copies,
                   self.forward + host / self.host_rate)


@dataclass(frozen=True)
class JointBound:
    """The bound and its terms (seconds); ``need``: bytes any fitting placement frees."""

    seconds: float
    compute: float
    copies: float
    optimizer: float
    need: int


StepCost = Callable[[float, float], float]


def param_facts(graph: Graph, state_bytes: Mapping[str, int], cost: Any
                ) -> list[ParamFacts]:
    """``ParamFacts`` of every parameter, in the graph's tensor order."""
    grads = gradients(graph)
    used = {graph.tensors[i].storage for op in graph.ops for i in op.inputs}
    tied = {t.storage for t in graph.tensors if t.is_view and t.kind is TensorKind.PARAMETER}
    out = []
    for name, tid in parameters(graph).items():
        t = graph.tensors[tid]
        gid = grads.get(name)
        grad = graph.tensors[graph.tensors[gid].storage].nbytes if gid is not None else 0
        h2d = d2h = 0.0
        if cost is not None:
            transfer = cost.transfer_time
            h2d = transfer(t.nbytes, "h2d") if tid in used else 0.0
            d2h = transfer(grad, "d2h") if grad else 0.0
        out.append(ParamFacts(name, tid, t.nbytes, grad, int(state_bytes.get(name, 0)),
                              math.prod(t.shape), h2d, d2h, tid not in tied))
    return out


def op_needs(graph: Graph, facts: list[ParamFacts]) -> list[tuple[int, frozenset[int]]]:
    """``(A_o, parameters o reads)`` of the module doc's per-op memory term, one per
    distinct set of parameters read (the largest ``A_o`` of the ops reading that set)."""
    params = {f.tensor for f in facts}
    largest: dict[frozenset[int], int] = {}
    for op in graph.ops:
        storages = {graph.tensors[i].storage for i in (*op.inputs, *op.outputs)}
        reads = frozenset(storages & params)
        resident = sum(graph.tensors[s].nbytes for s in storages - params)
        if resident > largest.get(reads, -1):
            largest[reads] = resident
    return [(resident, reads) for reads, resident in largest.items()]


def op_times(graph: Graph, cost: Any) -> list[float]:
    """Seconds of every op on ``cost`` (bound to the graph; 0 for views): the fastest of
    the framework kernel and the variants the op offers, so the sum bounds any schedule's
    compute whatever variants it picks."""
    model = cost.bind(graph)
    out = []
    for op in graph.ops:
        if op.category is OpCategory.VIEW:
            out.append(0.0)
            continue
        best = float(model.op_time(dataclasses.replace(op, variant="")))
        for name, info in op.variant_options.items():
            if "refused" not in info:
                best = min(best, float(model.op_time(dataclasses.replace(op, variant=name))))
        out.append(best)
    return out


def min_cover(items: list[tuple[float, float]], need: float) -> float:
    """min sum(c_i x_i) over 0 <= x_i <= 1 with sum(b_i x_i) >= need, for ``(b_i, c_i)``
    pairs with b_i >= 0, c_i >= 0 (a covering knapsack's relaxation: take the cheapest
    cost per byte first, the last one fractionally). ``inf`` when even all do not cover."""
    if need <= 0:
        return 0.0
    total = 0.0
    for b, c in sorted(items, key=lambda bc: (bc[1] / bc[0]) if bc[0] > 0 else math.inf):
        if b <= 0:
            continue
        if need <= b:  # the last one, fractionally: covered (no residue of need - need/b*b)
            return total + c * (need / b)
        total += c
        need -= b
    return math.inf


def joint_lower_bound(graph: Graph, budget: int, cost: Any, state_bytes: Mapping[str, int],
                      *, step_cost: StepCost | None = None, overlap: Overlap | None = None
                      ) -> JointBound | None:
    """Seconds no placement and activation plan within ``budget`` beats (module doc); None
    when no placement fits the memory term (holding everything frees too little).
    ``step_cost(host_numel, device_numel)``: the optimizer's seconds (default
    ``optimizer_seconds`` at its default rates); ``overlap``: the optimizer overlapped with
    the pass instead (then ``optimizer`` is what it adds to ``max(compute, copies)``)."""
    step_cost = step_cost or (lambda h, d: optimizer_seconds(int(h), int(d)))
    every = param_facts(graph, state_bytes, cost)
    need = sum(f.freed for f in every) - budget
    facts = [f for f in every if f.holdable]
    if need > sum(f.freed for f in facts):
        return None
    compute = sum(op_times(graph, cost))
    engines = int(getattr(cost, "copy_engines", 2))
    resident = sum(f.weight + f.state for f in every)
    covers = [(need, {f.name: f.freed for f in facts})]
    for extra, reads in op_needs(graph, every):
        covers.append((resident + extra - budget,
                       {f.name: f.state + (0 if f.tensor in reads else f.weight)
                        for f in facts}))
    copies = host = 0.0
    for need_o, freed in covers:
        if need_o > sum(freed.values()):
            return None  # this op alone does not fit beside the weights, whatever is held

        def cover(cost_of: Callable[[ParamFacts], float], freed: dict[str, int] = freed,
                  need_o: int = need_o) -> float:
            return min_cover([(freed[f.name], cost_of(f)) for f in facts], need_o)

        if engines < 2:
            copies = max(copies, cover(lambda f: f.h2d + f.d2h))
        else:
            copies = max(copies, cover(lambda f: f.h2d), cover(lambda f: f.d2h))
        host = max(host, cover(lambda f: float(f.numel)))
    numel = sum(f.numel for f in every)
    if overlap is not None:
        device = numel - sum(f.numel for f in facts)  # the fewest device elements
        seconds = overlap.seconds(compute, copies, host, device)
        return JointBound(seconds, compute, copies, seconds - max(compute, copies),
                          max(0, need))
    optimizer = step_cost(host, numel - host)
    return JointBound(max(compute, copies) + optimizer, compute, copies, optimizer,
                      max(0, need))


def placement_bound(held: list[ParamFacts], every: list[ParamFacts], compute: float,
                    engines: int, step_cost: StepCost, overlap: Overlap | None = None
                    ) -> float:
    """Seconds no activation plan beats with exactly ``held`` in host memory: the module
    doc's argument for one placement (compute, the held parameters' one prefetch and
    their gradients' one offload on the copy engines, the optimizer at that split). The
    chooser skips planning a placement whose bound is no better than the best step found
    (branch and bound: the skipped ones cannot win)."""
    h2d = sum(f.h2d for f in held)
    d2h = sum(f.d2h for f in held)
    copies = h2d + d2h if engines < 2 else max(h2d, d2h)
    host = sum(f.numel for f in held)
    device = sum(f.numel for f in every) - host
    if overlap is not None:
        return overlap.seconds(compute, copies, host, device)
    return max(compute, copies) + step_cost(host, device)

