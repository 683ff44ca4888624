"""The bound model's LP runs on HiGHS's interior point method with crossover: same optimum as
the dual simplex. The primal relaxation (whose vertex seeds the search) stays on the simplex."""

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies.optimal import build_problem, formulation
from outcore.sim.synthetic import residual_chain

GRAPH = residual_chain(4, activation_bytes=1 << 30, conv_flops=2e10)
COST = cost_model_for("v100-pcie")
PEAK = reference_peaks(GRAPH).liveness


@pytest.mark.parametrize("fraction", [0.5, 0.7, 0.9])
def test_ipm_bound_lp_value_equals_the_simplex_lp_value(monkeypatch, fraction):
    problem = build_problem(GRAPH, COST, int(PEAK * fraction))
    assert formulation.LP_SOLVER == "ipm"
    ipm = formulation.Model(problem, relaxed=True).solve(integral=False)
    monkeypatch.setattr(formulation, "LP_SOLVER", "simplex")
    simplex = formulation.Model(problem, relaxed=True).solve(integral=False)
    assert ipm.optimal and simplex.optimal
    assert ipm.objective == pytest.approx(simplex.objective, rel=1e-6)
    assert ipm.bound == pytest.approx(simplex.bound, rel=1e-6)
    assert ipm.objective >= problem.in_core_time * (1 - 1e-9)


def test_only_the_bound_lp_is_sent_to_the_ipm(monkeypatch):
    problem = build_problem(GRAPH, COST, int(PEAK * 0.6))
    seen: list[dict] = []
    real = formulation.milp

    def spy(*args, options, **kwargs):
        seen.append(dict(options))
        return real(*args, options=options, **kwargs)

    monkeypatch.setattr(formulation, "milp", spy)
    formulation.Model(problem, relaxed=True).solve(integral=False)
    formulation.Model(problem, relaxed=False).solve(integral=False)
    formulation.Model(problem, relaxed=True).solve(integral=True, node_limit=10)
    assert [o.get("solver") for o in seen] == ["ipm", None, None]
