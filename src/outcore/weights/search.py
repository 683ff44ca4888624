"""The placements the weights chooser plans: prefixes of two rankings at a few byte targets.

Plain Python (no torch). Every candidate holds a *prefix* of a ranking of the parameters,
the shortest one whose freed bytes (weight + gradient + optimizer state) reach a target:

* ``bytes``: largest freed bytes first (few, large copies);
* ``cost``: most freed bytes per second of what holding costs first. Holding ``p`` costs
  its optimizer step moved to the host (``step_cost(n_p, 0) - step_cost(0, n_p)``) and the
  part of its copies the compute before them cannot hide: its forward prefetch is hoisted
  into the heavy op before its first forward use, its backward prefetch into the heavy op
  before its first backward use, its gradient's offload overlaps the heavy op after the op
  that makes it. A parameter used first in forward (nothing before it to hide under), or
  used late in forward and at once in backward (the head, the last block) is exposed and
  ranks late; one behind a large matmul ranks early.

Targets, per ranking: first ``need`` (the bytes the memory term of
``outcore.weights.bound`` says any fitting placement frees; 0 when the weights fit); when
the activation planners cannot fit that placement, the target grows by what they lacked
(their lowest peak less the budget), up to ``STEPS`` times. From the first fitting target
``wider`` adds more held bytes (``MORE``), and ``refine`` the midpoints around the best.
Deterministic: ties rank by tensor id.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from outcore.graph.ir import Graph, OpCategory, Phase
from outcore.weights.bound import ParamFacts

#: how much of the bytes left after the first fitting target ``wider`` adds
MORE = (0.25, 1.0)
#: fitting tries per ranking: each adds what the failed one lacked
STEPS = 4
HEAVY = frozenset({OpCategory.CONV, OpCategory.MATMUL, OpCategory.ATTENTION})


@dataclass(frozen=True)
class Proposal:
    """A placement to plan: the held names, the ranking and the byte target that made it."""

    names: tuple[str, ...]
    ranking: str
    target: float


def exposure(graph: Graph, facts: list[ParamFacts], times: list[float]) -> dict[str, float]:
    """Seconds of each parameter's copies that the heavy compute next to them cannot hide,
    if it were held (module doc); ``times``: each op's seconds."""
    heavy = [op.id for op in graph.ops if op.category in HEAVY]
    readers: dict[int, list[int]] = {}
    makers: dict[int, int] = {}
    for op in graph.ops:
        for i in op.inputs:
            readers.setdefault(graph.tensors[i].storage, []).append(op.id)
        for o in op.outputs:
            makers.setdefault(graph.tensors[o].storage, op.id)
    grads = _grad_storages(graph)

    def before(oid: int) -> float:
        k = bisect.bisect_left(heavy, oid)
        return times[heavy[k - 1]] if k else 0.0

    def after(oid: int) -> float:
        k = bisect.bisect_right(heavy, oid)
        return times[heavy[k]] if k < len(heavy) else 0.0

    out = {}
    for f in facts:
        uses = readers.get(f.tensor, [])
        fwd = [o for o in uses if graph.ops[o].phase is Phase.FORWARD]
        bwd = [o for o in uses if graph.ops[o].phase is Phase.BACKWARD]
        exposed = 0.0
        for first in (fwd[:1] + bwd[:1]):
            exposed += max(0.0, f.h2d - before(first))
        made = makers.get(grads.get(f.name, -1))
        if made is not None:
            exposed += max(0.0, f.d2h - after(made))
        out[f.name] = exposed
    return out


def _grad_storages(graph: Graph) -> dict[str, int]:
    from outcore.plan.weights import gradients

    return {n: graph.tensors[g].storage for n, g in gradients(graph).items()}


def rankings(facts: list[ParamFacts], exposed: dict[str, float],
             step_cost: Callable[[float, float], float]) -> dict[str, list[str]]:
    """The two rankings of the module doc, by name (holdable parameters only)."""
    facts = [f for f in facts if f.holdable]
    by_bytes = sorted(facts, key=lambda f: (-f.freed, -f.tensor))

    def held_cost(f: ParamFacts) -> float:
        return max(0.0, step_cost(f.numel, 0) - step_cost(0, f.numel)) + exposed.get(f.name, 0.0)

    by_cost = sorted(facts, key=lambda f: (-(f.freed / max(held_cost(f), 1e-15)), -f.tensor))
    return {"bytes": [f.name for f in by_bytes], "cost": [f.name for f in by_cost]}


def prefix(order: list[str], freed: dict[str, int], target: float) -> tuple[str, ...]:
    """The shortest prefix of ``order`` whose freed bytes reach ``target``."""
    acc = 0
    for k, name in enumerate(order):
        if acc >= target:
            return tuple(order[:k])
        acc += freed[name]
    return tuple(order)


def at(order: list[str], freed: dict[str, int], target: float, ranking: str) -> Proposal:
    """The proposal holding the shortest prefix of ``order`` that frees ``target`` bytes."""
    return Proposal(prefix(order, freed, target), ranking, target)


def wider(fitting: dict[str, float], total: int, freed: dict[str, int],
          orders: dict[str, list[str]]) -> list[Proposal]:
    """From each ranking's first fitting target ``t``: ``t`` plus ``MORE`` of the rest of
    the bytes (more held, more room for the activations, a slower optimizer step)."""
    return [at(orders[r], freed, t + f * (total - t), r) for r, t in fitting.items()
            for f in MORE]


def refine(best: Proposal, targets: list[float], freed: dict[str, int],
           orders: dict[str, list[str]]) -> list[Proposal]:
    """Midpoints between ``best``'s target and its neighbours among ``targets`` (those
    tried on its ranking)."""
    ts = sorted(set(targets) | {best.target})
    k = ts.index(best.target)
    mids = [(ts[k - 1] + best.target) / 2] if k > 0 else []
    mids += [(ts[k + 1] + best.target) / 2] if k + 1 < len(ts) else []
    return [at(orders[best.ranking], freed, m, best.ranking) for m in mids]
