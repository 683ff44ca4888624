"""Better integral plans of the primal model where the LP-guided search stays far above
the primal LP: the whole model as one MILP, stopped at its root node.

``planner._search`` rounds the primal LP, re-solves the LP's fractional candidates with the
settled ones fixed, and re-solves segments of ``SEGMENT`` candidates with the others fixed.
Fixing the LP's settled candidates is what loses on the transformer rows: on the zoo
transformer at 40% of its in-core peak (a100-40gb) the search ends at 0.6762 s of model
step, 2.0% above the primal LP (0.6628 s), while HiGHS's root node on the whole model (its
cuts and its RINS/RENS heuristics, which may move every candidate) finds 0.6713 s; on h100,
0.2859 s against 0.2828 s (planner_table.py rows, 26 Nov 2026).

``improve`` runs that root node only where it can pay: on models of at most ``ROOT_CANDIDATES``
candidates, and only when the search's best plan is more than ``above_lp`` (the planner's
``STOP_GAP``) above the primal LP (elsewhere the search is already within that of every plan
the model allows, and the root node would only cost time) and at most ``FAR_ABOVE_LP`` above it
(beyond, the LP is far from every integral point and the root node's cuts and heuristics, which
start from it, did not find a better plan: on ResNet-50 b256 at its lowest budget,
``r50b256-floor``, the search ends at 1.768 s of model step against the LP's 1.195 s, +48%, and
the root node spent 26.4 s CPU to find nothing, 27 Nov 2026). Its MILP is cut off at the
search's best model step (HiGHS prunes every node that cannot beat it). The work is counted in
nodes (``ROOT_NODES``), never in seconds, so the plan is the same on any load. Every solution
it returns is an integral point of the primal model; the caller lowers, verifies, measures and
simulates it like the search's (``planner._primal``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from outcore.policies.optimal.formulation import Model, Solution

#: Largest model (candidates) whose root node ``improve`` solves: the zoo transformer (246
#: candidates) is in. DenseNet-121 b64 (489) is not: there the root node cost 65 s CPU and
#: found no better plan (0.3585 s simulated either way); GPT-2-medium (486) is within 3%
#: of its bound without it.
ROOT_CANDIDATES = 300
#: Branch-and-bound nodes of the root MILP (1: the root node alone).
ROOT_NODES = 1
#: ``improve`` runs at most this far above the primal LP (see the module doc); the lower
#: end is the caller's ``above_lp`` (the planner passes its ``STOP_GAP``: improve runs exactly
#: when the search ended without meeting its stopping rule).
FAR_ABOVE_LP = 0.10
#: The root MILP's relative gap (as the search's MILPs).
ROOT_GAP = 1e-3


def improve(model: Model, lp: Solution, tries: Sequence[Solution], *,
            above_lp: float) -> list[Solution]:
    """Integral solutions better (by the model's step) than every one of ``tries``, from the
    whole primal ``model`` as a MILP stopped after ``ROOT_NODES`` nodes; ``lp`` is the
    model's LP relaxation (its value gates the attempt, see the module doc). Empty when
    the model is too large, the search is within ``above_lp`` of the LP or more than
    ``FAR_ABOVE_LP`` above it, or HiGHS finds nothing better."""
    if model.relaxed or len(model.p.candidates) > ROOT_CANDIDATES:
        return []
    found = [t.objective for t in tries  # ``lp`` itself: its value is not its rounding's step
             if t is not lp and t.choice and math.isfinite(t.objective)]
    best = min(found, default=math.inf)
    if math.isfinite(best) and not (lp.objective * (1 + above_lp) < best
                                    <= lp.objective * (1 + FAR_ABOVE_LP)):
        return []
    cutoff = best * (1 - 1e-6) if math.isfinite(best) else None
    sol = model.solve(integral=True, node_limit=ROOT_NODES, gap=ROOT_GAP, cutoff=cutoff)
    if sol.choice and math.isfinite(sol.objective) and sol.objective < best:
        return [sol]
    return []
