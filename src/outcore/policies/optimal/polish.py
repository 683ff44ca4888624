"""A local search on lowered plans, by their simulated step, where the model's search is
far from its LP.

The primal model (``formulation``) prices a plan by its own step and memory rows; at the
lowest feasible budget its plans are far from its LP relaxation, and the model misjudges
which moves fit: on ResNet-50 b256 at its floor (``r50b256-floor``, v100-pcie, 3.40 GiB) the
search ends at 1.768 s of model step against the LP's 1.195 s, and its plan simulates at
1.817 s with 8.0 GiB offloaded and 0.89 s of copy stalls. Recomputing three of its
offloaded 784 MiB convolution outputs instead fits the budget under the real memory rule
and simulates at 1.404 s; with the moves below (a recompute that keeps its freed input
alive) ``polish`` ends at 1.372 s, in 21 s CPU (27 Nov 2026). The model's search did not
reach those plans.

``polish`` moves one candidate at a time and keeps a move only when the lowered plan
verifies, fits the budget under ``outcore.plan.memory``'s rule and simulates strictly
faster; so the plan it returns is never slower than the one it was given, and every plan
it returns is one ``outcore.plan.lower`` lowers (the lower bound covers it). Moves, per
candidate (largest first, then by tensor id): an offload becomes a recompute, a keep, an
earlier prefetch option or a later release option; a recompute becomes a keep or a
just-in-time offload; a keep becomes a recompute (recomputes only where the primal model
prices them, ``Candidate.recompute``: with the chain it marks, and without it, so that
lowering keeps the chain's inputs alive instead of re-making them). The first improving
move of a candidate is taken (first improvement), and passes repeat until one changes
nothing or ``MAX_EVALS`` lowered plans were simulated. Deterministic: the work is counted
in evaluations, never in seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from outcore.cost.model import CostModel
from outcore.errors import ScheduleError
from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.plan.verify import verify
from outcore.policies.optimal.problem import Candidate, Problem

#: Lowered plans simulated at most by one ``polish`` (about 30 ms each on ResNet-50 b256:
#: two passes over its 211 candidates).
MAX_EVALS = 1000
#: Relative improvement a move must bring to be kept (guards against float noise).
MIN_GAIN = 1e-9


def polish(graph: Graph, problem: Problem, cost: CostModel, plan: Plan, schedule: Schedule,
           step: float, *, max_evals: int = MAX_EVALS) -> tuple[Plan, Schedule, float]:
    """The plan after the local search (module doc), its schedule and simulated step;
    ``plan`` itself when no move helps. ``plan`` must fit ``problem.budget``."""
    from outcore.sim import simulate

    budget = problem.budget
    order = sorted(problem.candidates, key=lambda c: (-c.nbytes, c.tensor))
    evals = 0
    changed = True
    while changed and evals < max_evals:
        changed = False
        for c in order:
            for trial in _moves(problem, plan, c):
                if evals >= max_evals:
                    break
                evals += 1
                try:
                    trial_schedule = lower(graph, trial)
                except ScheduleError:
                    continue
                if memory_curve(graph, trial_schedule).peak > budget:
                    continue
                trial_step = simulate(graph, trial_schedule, cost).step_time
                if trial_step < step * (1 - MIN_GAIN):
                    verify(graph, trial_schedule)
                    plan, schedule, step, changed = trial, trial_schedule, trial_step, True
                    break
    return plan, schedule, step


def _moves(problem: Problem, plan: Plan, c: Candidate) -> Iterator[Plan]:
    """The plans one move of candidate ``c`` away from ``plan`` (module doc)."""
    t = c.tensor
    decision = plan.decision(t)
    recompute = c.recompute is not None  # a recompute the primal model can price
    if decision is Decision.OFFLOAD:
        if recompute:
            yield from _recomputes(problem, plan, c)
        yield _set(problem, plan, c, Decision.KEEP)
        at = {oid: s for s, oid in enumerate(problem.op_order)}
        q = at.get(plan.prefetch_at.get(t, -1), c.first_backward)
        for option in c.options:
            if option < q:
                yield _set(problem, plan, c, Decision.OFFLOAD, prefetch=option,
                           release=plan.release_at.get(t))
        rho = at.get(plan.release_at.get(t, -1), c.last_forward + 1)
        for option in c.release:
            if option > rho:
                yield _set(problem, plan, c, Decision.OFFLOAD, prefetch=q,
                           release=problem.op_order[option])
    elif decision is Decision.RECOMPUTE:
        yield _set(problem, plan, c, Decision.KEEP)
        yield _set(problem, plan, c, Decision.OFFLOAD, prefetch=c.first_backward)
    elif recompute:
        yield from _recomputes(problem, plan, c)


def _recomputes(problem: Problem, plan: Plan, c: Candidate) -> Iterator[Plan]:
    """``c`` recomputed with the chain the primal model marks (its freed inputs re-made),
    and, when that chain is not empty, without it (lowering keeps those inputs alive)."""
    yield _set(problem, plan, c, Decision.RECOMPUTE)
    if c.chain:
        yield _set(problem, plan, c, Decision.RECOMPUTE, chain=False)


def _set(problem: Problem, plan: Plan, c: Candidate, decision: Decision, *,
         prefetch: int | None = None, release: int | None = None, chain: bool = True) -> Plan:
    """``plan`` with candidate ``c`` moved to ``decision``; ``prefetch`` is a stage, and
    ``release`` an op id. A recompute also marks the chain the primal model would
    (``Candidate.chain``) when ``chain``."""
    t = c.tensor
    decisions = dict(plan.decisions)
    prefetch_at = {k: v for k, v in plan.prefetch_at.items() if k != t}
    release_at = {k: v for k, v in plan.release_at.items() if k != t}
    reasons = dict(plan.reasons)
    decisions.pop(t, None)
    if decision is Decision.RECOMPUTE:
        decisions[t] = decision
        for u in c.chain if chain else ():
            decisions[u] = Decision.RECOMPUTE
        why = "recompute"
    elif decision is Decision.OFFLOAD:
        decisions[t] = decision
        prefetch_at[t] = problem.op_order[prefetch if prefetch is not None else c.first_backward]
        if release is not None:
            release_at[t] = release
        why = "offload"
    else:
        why = "keep"
    reasons[t] = f"{why} {c.nbytes} B [local search on simulated steps, {__name__}]"
    return dataclasses.replace(plan, decisions=decisions, prefetch_at=prefetch_at,
                               release_at=release_at, reasons=reasons)
