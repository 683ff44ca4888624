"""PoocH's classification of feature maps into keep / swap / recompute (§4.4).

Every candidate classification is scored by the timeline simulation of ``common.timeline``
(time, and whether memory ever exceeds the budget). The steps, as in the paper:

0. **Profiling**: simulate the safest classification, every map swapped (§4.2). If even it
   overflows, the budget is infeasible; the error names the least memory all-swap needs
   (copy-outs waited for at once, copy-ins just in time).
1. **Keep or swap** (§4.4.2). From the all-swap timeline, LO = maps whose copy-out is not
   hidden (it ends after forward's computation, or forward had to wait for it) and LI = maps
   whose copy-in is not hidden (the compute stream waited for it). Maps in neither stay
   swapped at once. The maps of LI are searched exhaustively (a binary tree, one level per
   map, from the output layer; "keep" explored first; a subtree whose keep-set already
   overflows is pruned: keeping more only adds memory). At each leaf the maps of LO \\ LI
   are scanned from the output layer and switched to keep while the classification fits
   and gets no slower (the paper's light-weight greedy for LO).
2. **Recompute** (§4.4.3). L = the maps still swapped. Repeat: r(X) = recompute overhead /
   swap overhead, both measured against keeping X with every other class fixed (the keep
   run may exceed the budget: it only prices); maps with r(X) >= 1 stay swapped and leave
   L; the map with the smallest r(X) < 1 becomes recompute. A recompute that overflows the
   budget gets r = inf.

Choices where the paper is silent: the exhaustive search over LI stops after
``step1_evaluations`` simulations (the best leaf found so far wins; the first leaf, the
greedy "keep from the output layer" one, is always completed), and step 2 after
``step2_evaluations`` (maps not yet examined stay swapped); when a swap costs nothing
against keep (swap overhead ~ 0), r(X) is 0 if recomputing is strictly faster than keeping,
else infinite. The benchmark reports both counts of simulations.

Skipped keep runs (planning time, issue 15). Step 2 runs X's recompute run first; when it
is infeasible (r = inf) or no faster than the current classification (``redo >=
current``), X's keep run is not simulated: r(X) >= 1 whatever it gives, so X leaves L either
way. Proof: with k the keep run's time, rounded subtraction is monotone, so ``redo - k >=
current - k``; when ``current - k > EPS`` the ratio of the two is >= 1 (rounded division is
monotone too, and b / b = 1); otherwise ``redo - k < (current - k) - EPS`` is false, so r is
infinite. The skipped run is still counted in ``step2_evaluations`` and against its limit,
so the classification, the ratios and the counts are the same as with every run made
(``test_step2_skips_only_keep_runs_that_cannot_matter``). On the 300-unit residual chain
(v100-pcie, half its peak) 597 of 1,194 step-2 runs are skipped; on ResNet-152 b256 only 17 of
3,000 (recomputing is faster than swapping almost everywhere there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from outcore.errors import InfeasibleBudgetError
from outcore.policies.common.timeline import (
    KEEP,
    RECOMPUTE,
    SWAP,
    Evaluation,
    FeatureClass,
    ForwardPrefixes,
    ForwardState,
    Profile,
    SwapInRule,
    earliest_fit,
    evaluate,
)
from outcore.units import format_bytes

EPS = 1e-12


def just_in_time(p: Profile, x: int, lo: int, need: int, memory, budget: float) -> int:
    """A ``SwapInRule`` issuing every copy-in right before its use."""
    return need


def all_swap_minimum(p: Profile) -> float:
    """The least peak of the all-swap classification: every copy-out waited for as soon as
    the map's last forward use is done, every copy-in issued just before its use."""
    return evaluate(p, {}, 0.0, swap_in_at=just_in_time, strict=False).peak


@dataclass
class Classification:
    """The result of the search, with what it saw on the way."""

    classes: dict[int, FeatureClass]
    evaluation: Evaluation
    profiling: Evaluation
    lo: list[int]
    li: list[int]
    ratios: dict[int, float] = field(default_factory=dict)  # r(X) when X became recompute
    step1_evaluations: int = 0
    step2_evaluations: int = 0

    def counts(self) -> dict[FeatureClass, int]:
        c = {KEEP: 0, SWAP: 0, RECOMPUTE: 0}
        for v in self.classes.values():
            c[v] += 1
        return c


class _Search:
    def __init__(self, p: Profile, budget: float, rule: SwapInRule) -> None:
        self.p, self.budget, self.rule = p, budget, rule
        self.evaluations = 0

    def run(self, classes: Mapping[int, FeatureClass], strict: bool = True,
            resume: ForwardState | None = None) -> Evaluation:
        self.evaluations += 1
        return evaluate(self.p, classes, self.budget, swap_in_at=self.rule, strict=strict,
                        sync_forward=None, resume=resume)


def classify(p: Profile, budget: float, *, step1_evaluations: int = 400,
             step2_evaluations: int = 3000, rule: SwapInRule = earliest_fit) -> Classification:
    """Run steps 0-2 (see the module docstring)."""
    search = _Search(p, budget, rule)
    classes = dict.fromkeys(p.features, SWAP)
    profiling = search.run(classes)
    if not profiling.feasible:
        need = all_swap_minimum(p)
        raise InfeasibleBudgetError(
            "pooch", int(budget), int(need),
            f"Even with every feature map swapped (copy-outs waited for at once, copy-ins just "
            f"in time) the step needs {format_bytes(need)}. Raise the budget, reduce the batch, "
            "or use a policy that also recomputes or splits the batch (moDNN).")
    lo = [x for x in p.features if profiling.copy_out_end.get(x, 0.0) > profiling.forward_end + EPS
          or profiling.forward_stall.get(x, 0.0) > EPS]
    li = [x for x in p.features if profiling.copy_in_stall.get(x, 0.0) > EPS]
    classes, best = _keep_or_swap(search, classes, profiling, lo, li, step1_evaluations)
    step1 = search.evaluations
    classes, best, ratios = _recompute(search, classes, best, step2_evaluations)
    return Classification(dict(best.classes), best, profiling, lo, li, ratios, step1,
                          search.evaluations - step1)


def _keep_or_swap(search: _Search, classes: dict[int, FeatureClass], start: Evaluation,
                  lo: list[int], li: list[int],
                  limit: int) -> tuple[dict[int, FeatureClass], Evaluation]:
    """Step 1: exhaustive over LI (bounded), greedy over LO \\ LI at each leaf."""
    prod = search.p.prod
    tree = sorted(li, key=lambda x: -prod[x])
    scan = sorted(set(lo) - set(li), key=lambda x: -prod[x])
    best: list = [start.time, dict(classes), start]
    leaves = [0]

    def leaf(cls: dict[int, FeatureClass], cur: Evaluation) -> None:
        for x in scan:
            trial = {**cls, x: KEEP}
            ev = search.run(trial)
            if ev.feasible and ev.time <= cur.time + EPS:
                cls, cur = trial, ev
        leaves[0] += 1
        if cur.time < best[0] - EPS:
            best[:] = [cur.time, cls, cur]

    def dfs(level: int, cls: dict[int, FeatureClass], cur: Evaluation) -> None:
        if leaves[0] and search.evaluations >= limit:
            return
        if level == len(tree):
            leaf(cls, cur)
            return
        trial = {**cls, tree[level]: KEEP}
        ev = search.run(trial)
        if ev.feasible:
            dfs(level + 1, trial, ev)
        dfs(level + 1, cls, cur)

    dfs(0, classes, start)
    return best[1], best[2]


def _recompute(search: _Search, classes: dict[int, FeatureClass], current: Evaluation,
               limit: int) -> tuple[dict[int, FeatureClass], Evaluation, dict[int, float]]:
    """Step 2: move swapped maps to recompute by r(X), smallest first."""
    start = search.evaluations
    pool = [x for x in search.p.features if current.classes.get(x) == SWAP]
    classes = dict(current.classes)
    ratios: dict[int, float] = {}
    while pool and search.evaluations - start < limit:
        r: dict[int, float] = {}
        trials: dict[int, Evaluation] = {}
        # every run below differs from ``classes`` in one map: its forward replay starts
        # at that map's producer (the same evaluations, ``ForwardPrefixes``)
        prefixes = ForwardPrefixes(search.p, classes, search.budget,
                                   {search.p.prod[x] for x in pool})
        for x in pool:
            if search.evaluations - start >= limit:
                break
            redo = search.run({**classes, x: RECOMPUTE}, resume=prefixes.at(search.p, x, True))
            if not redo.feasible or redo.time >= current.time:
                # r(X) >= 1 whatever the keep run gives (module doc, "Skipped keep
                # runs"): counted, as the limit counts it, but not simulated
                search.evaluations += 1
                r[x] = float("inf")
                continue
            kept = search.run({**classes, x: KEEP}, strict=False,
                              resume=prefixes.at(search.p, x, False)).time
            trials[x] = redo
            swap_cost, redo_cost = current.time - kept, redo.time - kept
            if swap_cost > EPS:
                r[x] = redo_cost / swap_cost
            else:
                r[x] = 0.0 if redo_cost < swap_cost - EPS else float("inf")
        pool = [x for x in pool if r.get(x, float("inf")) < 1.0]
        if not pool:
            break
        chosen = min(pool, key=lambda x: (r[x], x))
        pool.remove(chosen)
        ratios[chosen] = r[chosen]
        classes[chosen] = RECOMPUTE
        current = trials[chosen]
        classes = dict(current.classes)
    return classes, current, ratios
