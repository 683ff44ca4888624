"""The LPs (bound model and primal relaxation) run on HiGHS's interior point method with
crossover: same optimum as the dual simplex, and a vertex (integral columns read as settled)."""

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies.optimal import build_problem, formulation
from outcore.policies.optimal.formulation import Model
from outcore.sim.synthetic import residual_chain

GRAPH = residual_chain(4, activation_bytes=1 << 30, conv_flops=2e10)
COST = cost_model_for("v100-pcie")
PEAK = reference_peaks(GRAPH).liveness


@pytest.mark.parametrize("relaxed", [True, False])
@pytest.mark.parametrize("fraction", [0.5, 0.7, 0.9])
def test_ipm_lp_value_equals_the_simplex_lp_value(monkeypatch, relaxed, fraction):
    problem = build_problem(GRAPH, COST, int(PEAK * fraction))
    assert formulation.LP_SOLVER == "ipm"
    ipm = Model(problem, relaxed=relaxed).solve(integral=False)
    monkeypatch.setattr(formulation, "LP_SOLVER", "simplex")
    simplex = Model(problem, relaxed=relaxed).solve(integral=False)
    assert ipm.optimal and simplex.optimal
    assert ipm.objective == pytest.approx(simplex.objective, rel=1e-6)
    assert ipm.bound == pytest.approx(simplex.bound, rel=1e-6)
    assert ipm.objective >= problem.in_core_time * (1 - 1e-9)


def test_ipm_lp_answer_is_read_into_a_choice_per_candidate():
    problem = build_problem(GRAPH, COST, int(PEAK * 0.6))
    sol = Model(problem, relaxed=False).solve(integral=False)
    assert len(sol.choice) == len(problem.candidates) == len(sol.settled)
    assert all(pick[0] in ("keep", "offload", "recompute") for pick in sol.choice)
