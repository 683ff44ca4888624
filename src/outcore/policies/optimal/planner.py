"""outcore-optimal: the bound model for a proven lower bound, the primal model for a plan,
both on HiGHS; the plan is lowered, verified and measured with the real memory rule, and
the model is cut where the rule measured more than the model predicted.

Steps (``plan_optimal``):

1. ``build_problem``: stages, in-core memory curve, candidates (plain data).
2. Bound: the relaxed model (``formulation``, ``relaxed=True``), as a MILP with HiGHS's dual
   bound when it has at most ``exact_candidates`` candidates, else its LP relaxation. The
   bound is never below the in-core compute time.
3. Plan: the primal model, as a MILP up to ``exact_candidates`` candidates (exact), else
   from its LP relaxation (``_search``): the rounded LP (``("offload", q)`` by the largest
   prefetch share, recompute when its share is the largest), the node-limited MILP over the
   LP's fractional candidates, a segment local search from it, and only when that search
   ends short of ``STOP_GAP``: outcore-checkpoint's and the greedy planner's plans mapped to
   the model (warm starts, ``_seed_plans``), with a second segment pass from the best seed
   when it beats the fractional MILP's solution.
   The search's MILPs stop at ``SEARCH_GAP`` (segments at ``SMALL_SEARCH_GAP`` on models of
   at most ``LARGE_SEARCH`` candidates; HiGHS's RINS/RENS heuristics stay on:
   ``SEARCH_LIGHT``), and a segment's MILP is cut off at the incumbent's step (it only
   looks for better). Stopping rule: the LP value is a lower bound on every integral
   solution of the primal model, so once the incumbent's model step is within ``STOP_GAP``
   of it the search ends (the seeds are then never planned, ``_LazySeeds``): no further
   search could gain more than ``STOP_GAP`` on the model. Where the time goes (ResNet-152
   b256 v100-pcie, 619 candidates, 23,649 rows; one thread): building the model 0.1 s,
   the primal LP 4.1-4.5 s, each MILP on the whole model 1.5 s or more (HiGHS's presolve,
   root and ~50 ms per node; Python is negligible).
   Each is lowered (``outcore.plan.lower``), verified (``outcore.plan.verify``), its peak taken with
   ``outcore.plan.memory`` and simulated; the fastest that fits wins. When none fits, the
   budget of the model at the Compute the excess precedes is lowered by the excess (a cut)
   and the model re-solved, up to ``MAX_CUTS`` rounds. Where the search's best model step
   ended more than ``rounding.FAR_ABOVE_LP`` above the primal LP (the model's search is
   poor there), the fastest plan that fits is improved by ``polish``, a local search on
   lowered plans by their simulated step (ResNet-50 b256 at its floor: 1.817 -> 1.372 s).
4. The step time is the simulator's (``outcore.sim.simulate``), and the gap is
   ``step / bound - 1``.

Deterministic: no HiGHS solve is given a wall-clock limit. Exact MILPs stop at
``EXACT_NODES`` branch-and-bound nodes, the search's MILPs at ``NODE_LIMIT``, LPs run to the
end; HiGHS's answer for a given model and node limit does not depend on the machine's load,
so the same input gives the same plan idle or loaded (data-parallel ranks compare plans).
The price: a MILP's seconds are not capped (``EXACT_CANDIDATES`` keeps exact models small).

Beyond ``LARGE_CANDIDATES`` movable activations the plan is the greedy planner's and the
bound the in-core step (``_greedy``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from outcore.cost.model import CostModel
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Compute, Schedule
from outcore.plan.verify import verify
from outcore.policies.optimal.formulation import Model, Solution
from outcore.policies.optimal.polish import polish
from outcore.policies.optimal.problem import Problem, build_problem
from outcore.policies.optimal.rounding import FAR_ABOVE_LP, improve

NAME = "outcore-optimal"
#: Up to this many candidates the primal and bound models are solved as MILPs.
EXACT_CANDIDATES = 80
MAX_CUTS = 8
#: Beyond this many candidates the plan is the greedy planner's and the bound the in-core
#: step (the LP relaxation of SuperNeurons' 2,500-unit ResNet does not solve in seconds).
LARGE_CANDIDATES = 2000
#: Candidates re-solved together in one step of the local search.
SEGMENT = 40
#: Passes of the segment local search at most (it stops earlier at a fixed point: a
#: whole pass of segments without a better plan).
SEARCH_PASSES = 1
#: Branch-and-bound nodes per MILP of the search on large graphs (deterministic work).
NODE_LIMIT = 200
#: The search stops once the incumbent's model step is within this fraction of the primal
#: LP relaxation's value (a proven lower bound on the primal model's optimum, so no further
#: search can gain more than this on the model). Deterministic: a comparison of model
#: steps, never a clock. On ResNet-152 b256 v100-pcie it ended the search after
#: two segment MILPs instead of sixteen (see ``_search``): 18 s CPU instead of 152 s,
#: plan 2.376 s against 2.365 s (bound 2.334); that model now stops at
#: ``LARGE_STOP_GAP``.
STOP_GAP = 0.01
#: Models of more than this many candidates stop their search at ``LARGE_STOP_GAP`` instead
#: of ``STOP_GAP``: there every MILP of the search is a whole-model solve of several
#: seconds (ResNet-152 b256 v100-pcie, 619 candidates: the fractional MILP 5.5 s CPU, each
#: segment MILP 3-7 s). Below it (DenseNet-121 b64, 489; GPT-2-medium, 486; ResNet-50 and
#: the zoo transformer) the search is unchanged. Deterministic: a count of candidates.
LARGE_SEARCH = 500
#: The stopping rule's gap on models above ``LARGE_SEARCH``: no further search could gain
#: more than 2% on the model. On ResNet-152 b256 v100-pcie the fractional MILP's solution
#: (model 2.3638 s, LP 2.3362 s: +1.2%) meets it, so no segment MILP runs: plan 2.3822 s
#: simulated (bound 2.334 s, +2.1%, within issue 15's 3%) against 2.3760 s after two
#: segment MILPs, for about 10 s CPU less (``_stop_gap``).
LARGE_STOP_GAP = 0.02
#: Relative gap at which the search's MILPs stop: ``STOP_GAP``, since the search stops
#: anyway once within it of the LP. On ResNet-152 b256 v100-pcie the MILP over the LP's
#: fractional candidates finds the same solution (model 2.3638 s) in 4.2 s CPU at 1% as in
#: 35-40 s at 1e-3 (the rest was spent failing to close the gap), and the first segment
#: the same improvement in 2.7 s against 19-20 s. The price, on ResNet-50 b640 v100-pcie:
#: each segment stops at its first solution within 1% of its own dual bound, so the plan
#: is 2.189 s (bound 2.135, +2.5%) against 2.152 s at 1e-3 with the whole segment pass.
#: Exact MILPs use ``Model.solve``'s 1e-4.
SEARCH_GAP = STOP_GAP
#: Relative gap at which each segment's MILP stops on models of at most ``LARGE_SEARCH``
#: candidates; beyond, ``SEARCH_GAP`` (the fractional MILP always stops at ``SEARCH_GAP``).
#: At 1% a segment keeps only its first improvement and the pass ends higher: GPT-2 medium
#: at 40% on a100 (486 candidates) simulated at 1.7904 s, +3.3% over its bound 1.734 s
#: (planner table of 28 Nov 2026); at 1e-3, with every improving incumbent simulated,
#: 1.7831 s (+2.8%). With the fractional MILP at 1e-3 too it was 1.7713 s, but DenseNet-121
#: at 35% then ended at 0.3580 s (+4.6% over 0.3423) against 0.3498 s (+2.2%) this way
#: (``/work/notes/s20/lead/trace_opt.py``). ResNet-152 (619 candidates) keeps 1%: its
#: search ends after the fractional MILP (``LARGE_STOP_GAP``).
SMALL_SEARCH_GAP = 1e-3
#: Whether the search's MILPs run without HiGHS's RINS/RENS heuristics. Off: on ResNet-50
#: b640 v100-pcie they find the better plan (2.152 s with them, 2.209 s without; the bound
#: is 2.135 s) for about 1.7x the search's time (planner_table.py, 26 Nov 2026).
SEARCH_LIGHT = False
#: Branch-and-bound nodes per exact MILP (at most ``EXACT_CANDIDATES`` candidates). Work is
#: bounded in nodes, never in seconds, so a plan does not depend on the machine's load.
EXACT_NODES = 1000


@dataclass
class OptimalResult:
    """A plan, its schedule, its simulated step, and the proof of how close it is.

    ``lower_bound``: no Plan of keep/offload/recompute decisions and prefetch points lowered
    by ``outcore.plan.lower`` (framework kernels, one sub-batch) simulates faster on this
    cost model. ``gap = step_time / lower_bound - 1``. ``exact``: the primal model was
    solved to optimality (as a MILP).
    """

    plan: Plan
    schedule: Schedule
    step_time: float
    lower_bound: float
    exact: bool
    seconds: float
    candidates: int

    @property
    def gap(self) -> float:
        return self.step_time / self.lower_bound - 1.0 if self.lower_bound > 0 else 0.0


def lowest_peak(problem: Problem) -> int:
    """The lowest Compute-sample peak any plan of this problem can reach (every candidate
    freed over its whole gap): a budget below it is infeasible."""
    drop = [0] * (problem.stages + 1)
    for c in problem.candidates:
        drop[c.last_forward + 1] += c.nbytes
        drop[c.first_backward] -= c.nbytes
    lowest, freed = 0, 0
    for t, mem in enumerate(problem.memory):
        freed += drop[t]
        lowest = max(lowest, mem - freed)
    return lowest


def plan_optimal(graph: Graph, budget: int, cost: CostModel, *,
                 exact_candidates: int | None = None,
                 exact_nodes: int = EXACT_NODES, search_segments: int | None = None,
                 bound: bool = True) -> OptimalResult:
    """Plan ``graph`` within ``budget`` bytes on ``cost`` (see the module doc).

    ``exact_candidates`` (None: ``EXACT_CANDIDATES``) is the most candidates solved as exact
    MILPs; ``exact_nodes`` bounds each exact MILP solve in branch-and-bound nodes (HiGHS
    keeps its best plan and dual bound when it is reached); ``search_segments`` caps the
    segment re-solves of the local search on graphs too large for the exact model
    (``_search``; None: one whole pass). The search's
    work is counted in segments and HiGHS nodes, never in seconds, so a plan does not depend
    on the machine's load (data-parallel ranks compare their plans): no solve has a
    wall-clock limit, so the same input gives the same plan on any load. ``bound=False`` skips
    the bound model (the result's ``lower_bound`` is then the in-core step, still a valid
    bound): outcore-auto's portfolio ranks plans by their simulated step and needs no bound.
    """
    from outcore.sim import simulate

    started = time.perf_counter()
    if exact_candidates is None:
        exact_candidates = EXACT_CANDIDATES
    problem = build_problem(graph, cost, budget)
    floor = lowest_peak(problem)
    if floor > budget:
        raise InfeasibleBudgetError(
            NAME, budget, floor,
            "That is the peak with every activation freed over its whole gap (offloaded or "
            "recomputed); split the batch into sub-batches (policy modnn) or shrink it.")
    exact = len(problem.candidates) <= exact_candidates
    if len(problem.candidates) > LARGE_CANDIDATES and problem.in_core_peak > budget:
        plan, schedule = _greedy(graph, budget, cost)
        return OptimalResult(plan, schedule, simulate(graph, schedule, cost).step_time,
                             problem.in_core_time, False, time.perf_counter() - started,
                             len(problem.candidates))
    floor_time = _bound(problem, exact, exact_nodes) if bound else problem.in_core_time
    plan, schedule, solved_exact = _primal(graph, problem, cost, exact, exact_nodes,
                                           search_segments)
    step = simulate(graph, schedule, cost).step_time
    return OptimalResult(plan, schedule, step, floor_time, solved_exact,
                         time.perf_counter() - started, len(problem.candidates))


_BEYOND_LP = (f"the graph has more than {LARGE_CANDIDATES} movable activations, beyond the "
              "LP's reach")


def _greedy(graph: Graph, budget: int, cost: CostModel,
            why: str = _BEYOND_LP) -> tuple[Plan, Schedule]:
    """outcore's greedy planner's plan, renamed: beyond ``LARGE_CANDIDATES`` (the LP takes
    minutes there; the bound reported is the in-core step), and when the model's plans still
    exceed the budget after ``MAX_CUTS`` cuts. Raises InfeasibleBudgetError when it does not
    fit either."""
    from outcore.policies.auto import shared_greedy

    plan, schedule = shared_greedy(graph, budget, cost)
    note = f" [{NAME}: {len(plan.decisions)} decisions from the greedy planner; {why}]"
    plan = dataclasses.replace(plan, policy=NAME,
                               reasons={t: r + note for t, r in plan.reasons.items()})
    return plan, dataclasses.replace(schedule, policy=NAME)


def _bound(problem: Problem, exact: bool, exact_nodes: int = EXACT_NODES) -> float:
    in_core = problem.in_core_time
    if max(problem.memory, default=0) <= problem.budget or not problem.candidates:
        return in_core
    sol = Model(problem, relaxed=True).solve(integral=exact, node_limit=exact_nodes)
    return max(in_core, sol.bound)


def _primal(graph: Graph, problem: Problem, cost: CostModel, exact: bool, exact_nodes: int,
            search_segments: int | None, starts: Sequence[list[tuple]] | None = None
            ) -> tuple[Plan, Schedule, bool]:
    from outcore.sim import simulate

    budget = problem.budget
    if max(problem.memory, default=0) <= budget:
        plan = _to_plan(graph, problem, [("keep",)] * len(problem.candidates), "fits in core")
        return plan, lower(graph, plan), True
    cuts: dict[int, int] = {}
    stage_of = {oid: s for s, oid in enumerate(problem.op_order)}
    last: tuple[Plan, Schedule] | None = None
    for _ in range(MAX_CUTS):
        model = Model(problem, relaxed=False, cuts=cuts)
        sol = model.solve(integral=exact, node_limit=exact_nodes)
        if not sol.choice:
            break
        if not exact and starts is None:
            starts = _LazySeeds(graph, problem, cost)
        tries = [sol] if exact else _search(model, sol, search_segments,
                                               [] if starts is None else starts)
        # rounding.py: the root MILP, when the search ended without meeting STOP_GAP
        tries += [] if exact else improve(model, sol, tries, above_lp=_stop_gap(model))
        best: tuple[float, Plan, Schedule, Solution] | None = None
        worst: tuple[Plan, Schedule, list[int]] | None = None
        for found in tries:
            plan = _to_plan(graph, problem, found.choice, _why(found, exact))
            schedule = lower(graph, plan)
            verify(graph, schedule)
            trace = memory_curve(graph, schedule)
            if trace.peak > budget:
                worst = worst or (plan, schedule, trace.device)
                continue
            step = simulate(graph, schedule, cost).step_time
            if best is None or step < best[0]:
                best = (step, plan, schedule, found)
        if best is not None:
            if not exact and _far_from_lp(sol, tries):
                plan, schedule, _ = polish(graph, problem, cost, best[1], best[2], best[0])
                return plan, schedule, False
            return best[1], best[2], exact and best[3].optimal and not cuts
        assert worst is not None
        last = (worst[0], worst[1])
        _add_cuts(graph, worst[1], worst[2], budget, stage_of, cuts)
    if last is None:
        raise InfeasibleBudgetError(
            NAME, budget, lowest_peak(problem),
            f"HiGHS found no plan within {exact_nodes} nodes ({sol.status}); raise the budget "
            "or exact_nodes, or use outcore-auto's other candidates.")
    try:  # the cuts did not converge (each moved the excess elsewhere): a plan that fits
        plan, schedule = _greedy(graph, budget, cost, "the model's plans still exceeded the "
                                 f"budget after {MAX_CUTS} cuts")
        if memory_curve(graph, schedule).peak <= budget:
            return plan, schedule, False
    except InfeasibleBudgetError:
        pass
    raise InfeasibleBudgetError(
        NAME, budget, memory_curve(graph, last[1]).peak,
        "The model's plan did not fit after its cuts; try outcore-auto's other candidates, "
        "sub-batches (modnn) or a larger budget.")


def _far_from_lp(lp: Solution, tries: Sequence[Solution]) -> bool:
    """The search's best model step is more than ``FAR_ABOVE_LP`` above the primal LP
    ``lp`` (where the model's own search is known to be poor, ``polish`` runs)."""
    found = [t.objective for t in tries if t is not lp and t.choice]
    return bool(found) and min(found) > lp.objective * (1 + FAR_ABOVE_LP)


def _search(model: Model, start: Solution, segments: int | None,
            seeds: Sequence[list[tuple]] = ()) -> list[Solution]:
    """Integral solutions from the LP relaxation ``start``, for the caller to simulate: the
    rounded LP; the MILP over the candidates the LP left fractional (the others fixed); a
    segment local search from it (``_segment_pass``; every improving incumbent is returned,
    since the model's step and the simulated one do not always fall together: GPT-2 medium
    at 40% on a100, model 1.7632 s simulated 1.7867 s, an earlier incumbent 1.7831 s); then,
    only when that search ends without meeting the stopping rule below, each of ``seeds``
    (other planners' plans as the model's choices, ``_choice_of``) the model finds feasible
    (warm starts), and a second segment pass from the best seed when it beats the
    fractional MILP's solution. Every MILP is bounded by ``NODE_LIMIT`` nodes and stops at
    ``SEARCH_GAP`` (segments: ``_search_gap``; deterministic work; no wall-clock limit).

    Stopping rule: ``start`` is the LP optimum, a lower bound on every integral solution
    of ``model``; once the incumbent's model step is at most ``(1 + STOP_GAP)`` times it,
    no search can gain more than ``STOP_GAP`` on the model, and the search stops (on
    models above ``LARGE_SEARCH`` candidates at ``LARGE_STOP_GAP``, ``_stop_gap``): after
    the fractional MILP, or after the first segment pass. ``seeds`` is read only when
    neither meets it, so a lazy sequence's planners never run otherwise (on ResNet-152
    b256 v100-pcie the first pass meets it, and outcore-checkpoint's search, 3.7-5.2 s
    CPU, is never run for a seed that was model-infeasible there anyway).

    Where the rule does not fire, the solutions returned include every one the earlier
    order (seeds before the pass) returned: the fractional MILP's, each feasible seed's, and
    the pass from the best of these (the second pass starts from the seed exactly when the
    earlier order's single pass did). Where the first pass meets the rule and a seed would
    have beaten the fractional MILP, the plan may differ from the earlier order's, still
    within ``STOP_GAP`` of the LP on the model. Deterministic: a comparison of model steps."""
    out = [start]
    enough = (start.objective * (1 + _stop_gap(model)) if math.isfinite(start.objective)
              else -math.inf)
    fixed: dict[int, float] = {}
    for k, pick in enumerate(start.choice):
        if start.settled[k]:
            fixed.update(model.fix(k, pick))
    sol = model.solve(integral=True, fixed=fixed, node_limit=NODE_LIMIT, gap=SEARCH_GAP,
                      light=SEARCH_LIGHT)
    first = sol if sol.choice and math.isfinite(sol.objective) else None
    if sol.choice:
        out.append(sol)
    if first is not None and first.objective <= enough:
        return out
    best = first
    if first is not None:
        trail: list[Solution] = []
        best = _segment_pass(model, first, segments, enough, trail)
        out += trail  # every improving incumbent: the simulator picks among them
        if best.objective <= enough:
            return out
    warm_best: Solution | None = None
    for seed in seeds:
        pins: dict[int, float] = {}
        for k, pick in enumerate(seed):
            pins.update(model.fix(k, pick))
        warm = model.solve(integral=True, fixed=pins, node_limit=NODE_LIMIT)
        if warm.choice and math.isfinite(warm.objective):
            out.append(warm)
            if warm_best is None or warm.objective < warm_best.objective:
                warm_best = warm
    if warm_best is not None and (first is None or warm_best.objective < first.objective):
        again = _segment_pass(model, warm_best, segments, enough)
        if again is not warm_best:
            out.append(again)
    return out


def _stop_gap(model: Model) -> float:
    """The stopping rule's gap for ``model``: ``STOP_GAP``, or ``LARGE_STOP_GAP`` beyond
    ``LARGE_SEARCH`` candidates (each MILP of the search costs seconds there)."""
    return LARGE_STOP_GAP if len(model.p.candidates) > LARGE_SEARCH else STOP_GAP


def _search_gap(model: Model) -> float:
    """The relative gap a segment's MILP stops at: ``SMALL_SEARCH_GAP``, or ``SEARCH_GAP``
    beyond ``LARGE_SEARCH`` candidates. Deterministic: a count of candidates."""
    return SEARCH_GAP if len(model.p.candidates) > LARGE_SEARCH else SMALL_SEARCH_GAP


def _segment_pass(model: Model, incumbent: Solution, segments: int | None,
                  enough: float, trail: list[Solution] | None = None) -> Solution:
    """The segment local search from ``incumbent``: each ``SEGMENT`` of candidates in
    production order is re-solved as a MILP with every other candidate fixed, and kept when
    the model's step falls, for ``SEARCH_PASSES`` passes at most (at most ``segments``
    re-solves); it stops at a fixed point (every segment re-solved against the same
    incumbent) or once the incumbent is within ``enough`` (the stopping rule). A segment's
    MILP looks only for plans better than the incumbent (``cutoff``), so HiGHS stops at the
    root where its bound shows there are none. Returns the final incumbent (``incumbent``
    itself when nothing better was found)."""
    cands = model.p.candidates
    order = sorted(range(len(cands)), key=lambda k: (cands[k].produce, cands[k].tensor))
    starts = list(range(0, len(order), SEGMENT))
    sweep = [lo for _ in range(SEARCH_PASSES) for lo in starts]
    idle = 0  # segments re-solved since the incumbent last changed
    for lo in sweep if segments is None else sweep[:segments]:
        if idle >= len(starts) or incumbent.objective <= enough:
            break  # a fixed point (every segment re-solved against this incumbent), or
            # within STOP_GAP of the LP bound
        free = set(order[lo:lo + SEGMENT])
        pins: dict[int, float] = {}
        for k, pick in enumerate(incumbent.choice):
            if k not in free:
                pins.update(model.fix(k, pick))
        better = incumbent.objective * (1 - 1e-6)
        step = model.solve(integral=True, fixed=pins, node_limit=NODE_LIMIT,
                           gap=_search_gap(model), cutoff=better, light=SEARCH_LIGHT)
        idle += 1
        if step.choice and step.objective < better:
            incumbent, idle = step, 0
            if trail is not None:
                trail.append(step)
    return incumbent


class _LazySeeds(Sequence[list[tuple]]):
    """``_seed_plans`` as the model's choices, planned on first read only (the search
    reads them only when neither its fractional MILP nor its first segment pass is within
    ``STOP_GAP`` of the LP)."""

    def __init__(self, graph: Graph, problem: Problem, cost: CostModel) -> None:
        self._args = (graph, problem, cost)
        self._seeds: list[list[tuple]] | None = None

    def _load(self) -> list[list[tuple]]:
        if self._seeds is None:
            graph, problem, cost = self._args
            self._seeds = [_choice_of(problem, seed)
                           for seed in _seed_plans(graph, problem.budget, cost)]
        return self._seeds

    def __len__(self) -> int:
        return len(self._load())

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        return self._load()[i]


def _seed_plans(graph: Graph, budget: int, cost: CostModel) -> list[Plan]:
    """Warm starts for the search on large graphs: outcore-checkpoint's and the greedy
    planner's plans (those that fit; PoocH's search is left out, it is the slow one). Inside
    outcore-auto's portfolio both are the very runs its own candidates return
    (``shared_checkpoint``, ``shared_greedy``): each planner runs once per plan."""
    from outcore.policies.auto import shared_checkpoint, shared_greedy

    plans = []
    for make in (shared_checkpoint, shared_greedy):
        try:
            plans.append(make(graph, budget, cost)[0])
        except InfeasibleBudgetError:
            continue
    return plans


def _choice_of(problem: Problem, plan: Plan) -> list[tuple]:
    """``plan``'s decisions as the primal model's choices: a recompute the model can price
    is a recompute, else (a deeper chain) an offload prefetched just in time, which frees
    the same bytes; an offload's prefetch and release go to the nearest option at or
    after (prefetch) / at or before (release) the plan's own."""
    stage_of = {oid: s for s, oid in enumerate(problem.op_order)}
    out: list[tuple] = []
    for c in problem.candidates:
        decision = plan.decision(c.tensor)
        if decision is Decision.RECOMPUTE and c.recompute is not None:
            out.append(("recompute",))
        elif decision is Decision.KEEP:
            out.append(("keep",))
        else:
            want = stage_of.get(plan.prefetch_at.get(c.tensor, -1), c.first_backward)
            q = next((o for o in c.options if o >= want), c.first_backward)
            if decision is Decision.RECOMPUTE:
                q = c.first_backward
            rel = stage_of.get(plan.release_at.get(c.tensor, -1), c.last_forward + 1)
            rho = max(r for r in (c.last_forward + 1, *c.release) if r <= rel)
            out.append(("offload", q, rho))
    return out


def _add_cuts(graph: Graph, schedule: Schedule, device: list[int], budget: int,
              stage_of: dict[int, int], cuts: dict[int, int]) -> None:
    """Lower the model's budget at the stage whose Compute follows each instruction where
    the real rule measured more than the budget, by the largest excess there."""
    ins = schedule.instructions
    next_stage = [len(stage_of) - 1] * (len(ins) + 1)
    for i in range(len(ins) - 1, -1, -1):
        op = ins[i]
        if isinstance(op, Compute) and not op.recompute:
            next_stage[i] = stage_of[op.op]
        else:
            next_stage[i] = next_stage[i + 1]
    excess: dict[int, int] = {}
    for i, mem in enumerate(device):
        if mem > budget:
            s = next_stage[i]
            excess[s] = max(excess.get(s, 0), mem - budget)
    for s, e in excess.items():
        cuts[s] = cuts.get(s, 0) + e


def _why(sol: Solution, exact: bool) -> str:
    how = "MILP optimum" if exact and sol.optimal else "rounded LP relaxation"
    return f"{how} of the joint model, model step {sol.objective * 1e3:.3f} ms"


def _to_plan(graph: Graph, problem: Problem, choice: list[tuple], how: str) -> Plan:
    plan = Plan(policy=NAME, budget=problem.budget)
    for c, pick in zip(problem.candidates, choice, strict=True):
        t = c.tensor
        if pick[0] == "offload":
            q = pick[1]
            plan.decisions[t] = Decision.OFFLOAD
            plan.prefetch_at[t] = problem.op_order[q]
            rho = pick[2] if len(pick) > 2 else c.last_forward + 1
            if rho > c.last_forward + 1:
                plan.release_at[t] = problem.op_order[rho]
            plan.reasons[t] = (f"offload {c.nbytes} B: {c.d2h * 1e3:.3f} ms out, "
                               f"{c.h2d * 1e3:.3f} ms back, prefetched before "
                               f"{graph.ops[problem.op_order[q]].name} (stage {q}, needed at "
                               f"{c.first_backward}); frees it over stages {rho}..{q - 1} "
                               f"[{how}]")
        elif pick[0] == "recompute":
            plan.decisions[t] = Decision.RECOMPUTE
            for u in c.chain:  # re-made first (forward intermediates backward never reads)
                plan.decisions[u] = Decision.RECOMPUTE
            plan.reasons[t] = (f"recompute {graph.producer_op(t).name}: "
                               f"{(c.recompute or 0.0) * 1e3:.3f} ms; frees {c.nbytes} B over "
                               f"stages {c.last_forward + 1}..{c.first_backward - 1} [{how}]")
        else:
            plan.reasons[t] = f"kept: {c.nbytes} B; the budget holds without moving it [{how}]"
    return plan
