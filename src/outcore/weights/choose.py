"""Which parameters go to host memory, planned with the activations against one budget.

Plain Python (no torch). The device budget holds, during the step, what the Schedule keeps
resident (``predicted_peak``: activations, the device-held parameters and gradients, the
held parameters while they are prefetched) and, across steps, the optimizer state of the
device-held parameters (``state_bytes``: AdamW's two moments, ...). The state of a held
parameter lives in host memory, where its optimizer step runs.

The rule (``choose_weights``), a portfolio over one family of placements:

* parameters are ranked by the device bytes holding them frees (weight + optimizer state),
  largest first; candidate placements hold a prefix of that ranking on the host, the
  prefixes whose bytes reach 0, 1/8, 1/4, 1/2, 3/4 and all of the total;
* for each candidate, the activations are planned by outcore-auto (and outcore-checkpoint)
  *through the same lowering*, so the activation planner sees the real peak, parameters'
  prefetches included, against ``budget - state of the device-held parameters``;
* among the candidates that fit, the one with the smallest estimated step time wins: the
  simulated schedule (copies overlapped with compute) plus the optimizer step, priced by
  ``outcore.weights.step_cost.step_seconds`` from the hardware profile (host-held
  parameters at the host's measured or catalogued AdamW rate, device-held ones on the
  device).

What this is not: a joint optimum. The placements are prefixes of one ranking (a
parameter's position in the layer order, hence how well its copy hides, is not weighed);
the optimizer step is added to the step time, not overlapped with backward; there is no
lower bound on the joint problem. ``WeightChoice.tried`` records every candidate, so a
report can show what each cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from outcore.errors import InfeasibleBudgetError, ScheduleError
from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Plan
from outcore.plan.schedule import Schedule
from outcore.plan.weights import WeightPlacement, gradients, parameters
from outcore.weights.step_cost import step_seconds

FRACTIONS = (0.0, 0.125, 0.25, 0.5, 0.75, 1.0)

Planner = Callable[[Graph, int, Any, Callable[[Graph, Plan], Schedule]], tuple[Plan, Schedule]]


@dataclass
class Candidate:
    """One placement tried: its held bytes, and its outcome (``error`` when none fitted)."""

    held_bytes: int
    params: int
    policy: str = ""
    peak: int = 0
    device_state: int = 0
    step_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    error: str = ""

    @property
    def fits(self) -> bool:
        return not self.error


@dataclass
class WeightChoice:
    """The chosen placement, the activation plan and Schedule that go with it, and why."""

    placement: WeightPlacement
    plan: Plan
    schedule: Schedule
    peak: int
    device_state: int
    host_bytes: int
    step_seconds: float
    optimizer_seconds: float
    tried: list[Candidate] = field(default_factory=list)

    def explain(self, graph: Graph) -> list[str]:
        """One line per candidate and one per held parameter: what moved and why."""
        lines = [f"held {c.params} parameters ({c.held_bytes} B): "
                 + (f"{c.policy}, peak {c.peak} B + state {c.device_state} B, "
                    f"step {c.step_seconds * 1e3:.3f} ms + optimizer "
                    f"{c.optimizer_seconds * 1e3:.3f} ms" if c.fits else f"no plan ({c.error})")
                 for c in self.tried]
        lines += [f"{graph.tensors[t].source}: held in host memory (prefetched before its "
                  "forward and backward use; gradient sent to host; optimizer step on host)"
                  for t in sorted(self.placement.params)]
        return lines


def ranking(graph: Graph, state_bytes: Mapping[str, int]) -> list[str]:
    """Parameter names, largest device bytes freed by holding them first (ties: later
    parameters first, whose backward use comes first)."""
    params = parameters(graph)
    size = {n: graph.tensors[t].nbytes + state_bytes.get(n, 0) for n, t in params.items()}
    return sorted(params, key=lambda n: (-size[n], -params[n]))


def choose_weights(graph: Graph, budget: int, cost: Any, state_bytes: Mapping[str, int], *,
                   planners: Mapping[str, Planner] | None = None,
                   simulate: Callable[[Graph, Schedule], float] | None = None,
                   profile: Any = None) -> WeightChoice:
    """The fastest candidate placement that fits ``budget`` (module doc); raises
    ``InfeasibleBudgetError`` naming the lowest need when none does. ``profile``: the
    hardware profile pricing the optimizer step (default: ``cost``'s)."""
    profile = cost if profile is None else profile
    if planners is None:
        planners = default_planners()
    params = parameters(graph)
    grads = gradients(graph)
    names = ranking(graph, state_bytes)
    freed = [graph.tensors[params[n]].nbytes + state_bytes.get(n, 0) for n in names]
    total = sum(freed)
    prefixes = sorted({_prefix(freed, f * total) for f in FRACTIONS})
    numel = {n: math.prod(graph.tensors[params[n]].shape) for n in names}
    best: WeightChoice | None = None
    tried: list[Candidate] = []
    lowest = None
    for k in prefixes:
        held = names[:k]
        placement = WeightPlacement(frozenset(params[n] for n in held),
                                    frozenset(grads[n] for n in held if n in grads))
        device_state = state_bytes_of(names[k:], state_bytes)
        cand = Candidate(held_bytes=sum(freed[:k]), params=k, device_state=device_state)
        cand.optimizer_seconds = sum(step_seconds(
            {"host": [numel[n] for n in held], "device": [numel[n] for n in names[k:]]},
            profile))
        tried.append(cand)
        room = budget - device_state
        if room <= 0:
            cand.error = f"the device-held optimizer state alone ({device_state} B) fills it"
            continue
        lowerer = partial(lower, weights=placement)
        errors: list[str] = []
        for pname, planner in planners.items():
            try:
                plan, schedule = planner(graph, room, cost, lowerer)
            except (InfeasibleBudgetError, ScheduleError) as exc:
                need = getattr(exc, "required", None)
                if isinstance(need, int):
                    need += device_state
                    lowest = need if lowest is None else min(lowest, need)
                errors.append(str(exc).splitlines()[0][:120])
                continue
            peak = predicted_peak(graph, schedule)
            if peak > room:
                errors.append(f"{pname}'s plan peaks at {peak} B > {room} B")
                continue
            seconds = simulate(graph, schedule) if simulate is not None else 0.0
            total_s = seconds + cand.optimizer_seconds
            if not cand.policy or total_s < cand.step_seconds + cand.optimizer_seconds:
                cand.policy, cand.peak, cand.step_seconds = pname, peak, seconds
                if best is None or total_s < best.step_seconds + best.optimizer_seconds:
                    best = WeightChoice(placement, plan, schedule, peak, device_state,
                                        sum(graph.tensors[t].nbytes for t in placement.params)
                                        + state_bytes_of(held, state_bytes),
                                        seconds, cand.optimizer_seconds)
        if not cand.policy:
            cand.error = errors[0] if errors else "no planner"
    if best is None:
        raise InfeasibleBudgetError(
            "outcore-auto (weights)", budget, lowest if lowest is not None else budget + 1,
            "Even with every parameter, gradient and optimizer state in host memory the "
            "step's activations and one layer's weights do not fit; raise the budget or "
            "shrink the batch or sequence.")
    best.tried = tried
    return best


def default_planners() -> dict[str, Planner]:
    """outcore-auto and outcore-checkpoint, each given the weights' lowering."""
    from outcore.policies.auto import plan_auto, plan_checkpoint

    return {"outcore-auto": plan_auto, "outcore-checkpoint": plan_checkpoint}


def state_bytes_of(names: list[str], state_bytes: Mapping[str, int]) -> int:
    return sum(state_bytes.get(n, 0) for n in names)


def _prefix(freed: list[int], target: float) -> int:
    """The shortest prefix of ``freed`` whose sum reaches ``target``."""
    acc = 0
    for k, b in enumerate(freed):
        if acc >= target:
            return k
        acc += b
    return len(freed)


def adam_state_bytes(graph: Graph) -> dict[str, int]:
    """Adam/AdamW's state per parameter of ``graph`` (two moments of the parameter's size
    and dtype, and a 4-byte step), as ``outcore.weights.optimizer.state_bytes`` sizes it:
    for a graph captured with fake tensors, where no optimizer is built."""
    return {n: 2 * graph.tensors[t].nbytes + 4 for n, t in parameters(graph).items()}
