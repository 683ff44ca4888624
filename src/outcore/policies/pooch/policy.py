"""PoocH (Ito et al., 2019): profiling-based out-of-core hybrid method, as an outcore policy.

Registered as ``"pooch"``. Each feature map (an activation backward reads) is classified
keep, swap or recompute to minimise the step time under the budget:

1. **Profiling** (§4.2): op times and transfer times come from the cost model (an analytic
   GPU profile, or a ``MeasuredProfile`` of real iterations); sizes and the malloc/free
   order from the graph. A "profiling iteration" is the timeline simulation of the all-swap
   classification (``outcore.policies.common.timeline``).
2. **Classification** (§4.4, ``outcore.policies.pooch.classify``): LO / LI from the
   profiling timeline, swap at once for maps in neither; exhaustive search over LI with the
   greedy keep-from-the-output scan of LO \\ LI at each leaf; then recompute by r(X).
3. **Swap-in scheduling** (§4.3): a copy-in is issued as early as memory allows (the
   earliest point from which the map fits until its use), in the order of use; swap-outs
   start right after their producer and the map is released when its copy has ended,
   forward never waiting for it (``outcore.policies.pooch.schedule`` writes the Schedule).

Because everything is decided from the cost model, a PCIe profile and an NVLink profile
give different classifications (Table 3: slow links recompute more).

Choices: "feature maps" are the activations at least 1/1024 of the largest one (batch-norm
statistics and other small saved tensors are kept); the execution order is the capture order;
without a budget the cost model's device memory is the budget. The classification is
re-checked on the built Schedule with ``outcore.plan.memory`` (the executor's rule); if the
built schedule's peak exceeds the budget (the timeline is a model of it, not the schedule
itself) the search is re-run against a budget lowered by the excess, up to
the ``retries`` option (``PoochConfig``, default 3) times.
Search limits: the ``step1_evaluations`` (400) and ``step2_evaluations`` (3000) options
(timeline simulations); ``features`` overrides the feature-map list.
"""

from __future__ import annotations

from dataclasses import dataclass

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Decision, Plan
from outcore.plan.verify import verify
from outcore.policies.common.context import budget_of, cost_of
from outcore.policies.common.timeline import KEEP, RECOMPUTE, SWAP, Profile
from outcore.policies.pooch.classify import Classification, classify
from outcore.policies.pooch.config import PoochConfig
from outcore.policies.pooch.schedule import build_schedule
from outcore.policies.registry import PolicyContext, PolicyOutput, register
from outcore.units import format_bytes

PAPER = ("Profiling based Out-of-core Hybrid Method for Large Neural Networks "
         "(Ito, Imai, Le Duc, Negishi, Kawachiya, Matsumiya, Endo; arXiv 1907.05013, 2019)")


@dataclass(kw_only=True)
class PoochResult(PolicyOutput):
    """PoocH's output (the one result type, ``PolicyOutput``; ``predicted_peak`` filled) and
    the classification and profiled timeline behind it."""

    classification: Classification
    profile: Profile


def plan_pooch(graph: Graph, ctx: PolicyContext) -> PoochResult:
    """Run PoocH and return the output with its classification."""
    config = ctx.config_as(PoochConfig)
    budget = budget_of(ctx, "PoocH")
    profile = Profile(graph, [op.id for op in graph.ops], cost_of(ctx, "PoocH"),
                      config.features)
    step1, step2 = config.step1_evaluations, config.step2_evaluations
    target = float(budget)
    for attempt in range(config.retries + 1):
        try:
            result = classify(profile, target, step1_evaluations=step1,
                              step2_evaluations=step2)
        except InfeasibleBudgetError:
            if attempt == 0:  # the user's own budget is out of reach
                raise
            break  # a lowered target is: the last schedule's peak is what PoocH reaches
        ev = result.evaluation
        schedule = build_schedule(graph, profile.order, ev.classes, ev.free_at, ev.issue_at,
                                  ev.need_at, policy="pooch")
        verify(graph, schedule)
        peak = predicted_peak(graph, schedule)
        if peak <= budget:
            return PoochResult(_plan(graph, profile, result, budget), schedule, graph,
                               predicted_peak=peak, classification=result, profile=profile)
        target -= peak - budget
    raise InfeasibleBudgetError(
        "pooch", budget, peak,
        f"The classification's schedule peaks at {format_bytes(peak)} after "
        f"{attempt} re-search(es) against a lowered budget. Raise the budget or raise "
        "options['retries'].")


def _plan(graph: Graph, profile: Profile, result: Classification, budget: int) -> Plan:
    ev = result.evaluation
    plan = Plan(policy="pooch", budget=budget)
    lo, li = set(result.lo), set(result.li)
    for x in profile.features:
        size = format_bytes(profile.size[x])
        where = ", ".join(n for n, s in (("LO", lo), ("LI", li)) if x in s) or "neither LO nor LI"
        cls = ev.classes[x]
        if cls == SWAP:
            plan.decisions[x] = Decision.OFFLOAD
            plan.prefetch_at[x] = profile.order[ev.issue_at[x]]
            plan.reasons[x] = (f"swap ({size}, {where}): copy-in issued "
                               f"{ev.need_at[x] - ev.issue_at[x]} ops before its use")
        elif cls == RECOMPUTE:
            plan.decisions[x] = Decision.RECOMPUTE
            chain = profile.chains[x]
            plan.reasons[x] = (f"recompute ({size}, {where}): r(X) = "
                               f"{result.ratios.get(x, float('nan')):.3g}, re-runs "
                               f"{len(chain.ops)} ops ({chain.seconds * 1e3:.3g} ms)")
        else:
            plan.reasons[x] = f"keep ({size}, {where}): fits, and swapping it was not hidden"
    assert all(ev.classes[x] in (KEEP, SWAP, RECOMPUTE) for x in profile.features)
    return plan


@register("pooch", "PoocH: keep / swap / recompute per feature map by timeline simulation "
          "(LO/LI search, then r(X)); swap-ins as early as memory allows", PAPER, PoochConfig)
def pooch(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    """PoocH for ``ctx.budget`` (see the module docstring)."""
    return plan_pooch(graph, ctx)
