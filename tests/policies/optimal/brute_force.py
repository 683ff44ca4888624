"""Brute force over every Plan of a small graph: each movable activation kept, recomputed, or
offloaded with its prefetch issued before any stage of its gap and its release (Wait d2h
+ Free) right after its last forward use or before any later forward stage before the
prefetch, and each forward
intermediate that backward never reads marked RECOMPUTE or not (a recompute chain re-makes
it instead of keeping it alive); the fastest plan that verifies and fits, by simulation.
The exact model must find it."""

from __future__ import annotations

import itertools
import math

from outcore.errors import ScheduleError
from outcore.graph.ir import Graph, Phase
from outcore.plan.lower import forward_intermediates, lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.verify import verify
from outcore.policies.baseline import movable_activations
from outcore.policies.optimal import build_problem, stage_order
from outcore.sim import simulate


def every_plan(graph: Graph, cost, budget: int):
    """Yield (plan, step_time) for every plan that verifies and fits ``budget``."""
    problem = build_problem(graph, cost, budget)
    order = stage_order(graph)
    forward = sum(1 for op in graph.ops if op.phase is Phase.FORWARD)
    choices = []
    for c in problem.candidates:
        opts: list[tuple] = [("keep",), ("recompute",)]
        # released (Wait d2h + Free) right after the last forward use, or before any later
        # forward op up to the prefetch
        opts += [("offload", q, rho) for q in range(c.last_forward + 1, c.first_backward + 1)
                 for rho in range(c.last_forward + 1, min(q, forward - 1) + 1)]
        choices.append(opts)
    # marking any other intermediate changes nothing: no recompute needs it
    needed = {d.storage for c in problem.candidates for d in c.dead_inputs}
    chains = sorted(needed & (forward_intermediates(graph) - set(movable_activations(graph))))
    choices += [[("no",), ("chain",)]] * len(chains)
    for combo in itertools.product(*choices):
        plan = Plan(policy="enumerated", budget=budget)
        picks = combo[:len(problem.candidates)]
        for u, flag in zip(chains, combo[len(problem.candidates):], strict=True):
            if flag[0] == "chain":
                plan.decisions[u] = Decision.RECOMPUTE
        for c, pick in zip(problem.candidates, picks, strict=True):
            if pick[0] == "recompute":
                plan.decisions[c.tensor] = Decision.RECOMPUTE
            elif pick[0] == "offload":
                plan.decisions[c.tensor] = Decision.OFFLOAD
                plan.prefetch_at[c.tensor] = order[pick[1]]
                if pick[2] > c.last_forward + 1:  # lowering releases before forward ops
                    plan.release_at[c.tensor] = order[pick[2]]
        try:
            schedule = lower(graph, plan)
            verify(graph, schedule)
        except ScheduleError:
            continue
        if memory_curve(graph, schedule).peak > budget:
            continue
        yield plan, simulate(graph, schedule, cost).step_time


def best_time(graph: Graph, cost, budget: int) -> float:
    return min((t for _, t in every_plan(graph, cost, budget)), default=math.inf)
