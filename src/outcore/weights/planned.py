"""``outcore.plan(graph, budget, optimizer=...)``: the weights planned with the activations.

Plain Python (no torch). With an optimizer (a name such as "adamw", an
``OptimizerSpec`` or a built ``torch.optim`` optimizer) the budget holds the whole step:
activations, parameters, gradients and the device-held optimizer state. ``plan_weights``
sizes the state (``outcore.weights.spec``), lets ``outcore.weights.choose`` decide which
parameters live in host memory with the activation plan, and returns a ``PlannedStep``
whose ``weights`` (a ``WeightReport``) says what moved, the host and pinned bytes, the step
with the optimizer step, the joint lower bound and gap. The chooser decides by the step with
the optimizer overlapped with backward (each host step as soon as its gradient has landed,
``outcore.sim.host_steps``) when the cost model has a hardware profile.

``weights``: "auto" (the default: hold on the host what makes the step fastest within the
budget; nothing when everything fits), "device" (hold nothing: the budget must hold every
weight, gradient and state) or "host" (hold every parameter).
"""

from __future__ import annotations

from typing import Any

from outcore.errors import InvalidArgumentError
from outcore.graph.ir import Graph
from outcore.plan.memory import memory_curve

#: activation planners ``plan(..., optimizer=...)`` accepts as ``policy``
POLICIES = ("outcore-auto", "outcore-checkpoint")


def plan_weights(graph: Graph, limit: int | None, policy: str, cost: Any, optimizer: Any,
                 weights: str | None, *, simulate: bool = True,
                 host_adam_rate: float | None = None, host_limit: int | None = None,
                 host_source: str = "") -> Any:
    """The PlannedStep of ``graph`` with its weights placed (module doc). Raises
    InvalidArgumentError (no budget, another policy, an unknown ``weights``) and
    InfeasibleBudgetError (no placement fits: the lowest need and the ways out).
    ``host_adam_rate``: the host's AdamW parameters per second; None reads the cost
    model's profile (its measured or catalogued ``host_adam_rate``, else its host
    bandwidth), and only a profile with neither falls back to ``outcore.weights.spec``'s
    constant (``choose._rates``). Another optimizer's step is priced from AdamW's rates by
    the bytes it moves per parameter (``outcore.weights.spec.update_bytes_of``). A named
    spec's fp32 masters of bf16/fp16 parameters, and their state, are host bytes stepped on
    the host with their casts, as ``MasterWeights`` keeps them
    (``outcore.weights.spec.graph_masters``)."""
    from outcore.planned import PlannedStep, _offload_sizes
    from outcore.sim import simulate as run_simulation
    from outcore.weights.choose import MODES, choose_weights, default_planners
    from outcore.weights.report import build_report
    from outcore.weights.spec import (
        graph_masters,
        graph_state_bytes,
        optimizer_name,
        update_bytes_of,
    )

    mode = weights or "auto"
    if mode not in MODES:
        raise InvalidArgumentError(weights, f"weights= among {MODES}")
    if limit is None:
        raise InvalidArgumentError(None, "a budget with optimizer=", "Planning the weights "
                                   "decides what the budget cannot hold; give budget=.")
    if policy not in POLICIES:
        raise InvalidArgumentError(policy, "policy outcore-auto or outcore-checkpoint with "
                                   "optimizer=", "The weights are planned with those "
                                   "activation planners; drop policy= or optimizer=.")
    state = graph_state_bytes(graph, optimizer)
    planners = default_planners()
    if policy == "outcore-checkpoint":
        planners = {policy: planners[policy]}
    choice = choose_weights(
        graph, limit, cost, state, planners=planners, mode=mode,
        host_adam_rate=host_adam_rate, update_bytes=update_bytes_of(optimizer),
        masters=graph_masters(graph, optimizer),
        overlap=getattr(cost, "profile", None) is not None,
        simulate=(lambda g, s: run_simulation(g, s, cost).step_time) if cost else None)
    trace = memory_curve(graph, choice.schedule)
    report = build_report(graph, choice, optimizer_name(optimizer), mode, trace.host)
    result = PlannedStep(graph, choice.plan, choice.schedule, choice.peak, limit,
                         notes=[f"weights: {report.summary()}"])
    result.weights = report
    result.host_peak = report.host_bytes
    result.host_budget = host_limit
    result.host_sizes = _offload_sizes(choice.schedule, trace)
    result.lower_bound = report.lower_bound
    if host_limit is not None and report.host_bytes > host_limit:
        from outcore.host import HostBudgetError

        raise HostBudgetError(policy, host_limit, report.host_bytes, host_source)
    if simulate and cost is not None:
        result.simulation = run_simulation(graph, choice.schedule, cost)
    return result

