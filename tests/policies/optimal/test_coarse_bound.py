"""The coarse bound model (``optimal.coarse``): merged prefetch and release options keep it
a bound (never above the brute-force optimum, never above the full model's value), and
``lower_bound`` solves the full model only where the plan's gap to the coarse bound is
above ``REFINE_ABOVE``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies.optimal import build_problem, coarsen, floor, formulation, lower_bound
from outcore.policies.optimal import policy as optimal_policy
from outcore.sim.synthetic import residual_chain

sys.path.insert(0, str(Path(__file__).parent))
from brute_force import best_time
from test_cascade_rows import cascade

COST = cost_model_for("v100-pcie")


def _graphs():
    yield "chain", residual_chain(2, activation_bytes=1 << 30, conv_flops=2e10)
    yield "long-copy-out", residual_chain(2, activation_bytes=1 << 28, conv_flops=3e11)
    yield "cascade", cascade()


CASES = [(name, fraction) for name, _ in _graphs() for fraction in (0.8, 0.0)]


def _bound(problem, integral: bool) -> float:
    return formulation.Model(problem, relaxed=True).solve(integral=integral).bound


@pytest.mark.parametrize(("name", "fraction"), CASES)
def test_the_coarse_bound_stays_below_the_optimum_and_the_full_bound(name, fraction):
    """The LP values compare exactly (a relaxation of a relaxation); the MILPs' dual bounds
    within HiGHS's relative gap (``Model.solve``'s 1e-4)."""
    graph = dict(_graphs())[name]
    budget = max(floor(graph, COST), int(reference_peaks(graph).liveness * fraction))
    problem = build_problem(graph, COST, budget)
    best = best_time(graph, COST, budget)
    full_lp, full_milp = _bound(problem, False), _bound(problem, True)
    for options, releases in [(1, 1), (2, 1), (3, 2)]:
        coarse = coarsen(problem, options, releases)
        assert any(len(c.bound_options) < len(f.bound_options)
                   for c, f in zip(coarse.candidates, problem.candidates, strict=True))
        assert _bound(coarse, False) <= full_lp * (1 + 1e-9)
        milp = _bound(coarse, True)
        assert milp <= full_milp * (1 + 1e-4)
        assert milp <= best * (1 + 1e-9)


def test_coarsen_keeps_the_latest_prefetch_and_the_last_release_option():
    graph = residual_chain(4, activation_bytes=1 << 28, conv_flops=4e9)
    problem = build_problem(graph, COST, int(reference_peaks(graph).liveness * 0.6))
    coarse = coarsen(problem, 2, 2)
    for c, f in zip(coarse.candidates, problem.candidates, strict=True):
        assert c.bound_options == f.bound_options[-2:]
        assert c.bound_options[-1] == f.first_backward
        if len(f.bound_release) > 2:
            assert c.bound_release == (f.bound_release[0], f.bound_release[-1])
        else:
            assert c.bound_release == f.bound_release
        assert (c.options, c.release) == (f.options, f.release)  # the primal's untouched
    with pytest.raises(ValueError, match="at least one option"):
        coarsen(problem, 0, 1)


class _Counted:
    """``optimal.policy._bound`` with a record of which problems it solved (coarse or full)."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, problem, exact, *args):
        full = all(len(c.bound_options) <= 2 and len(c.bound_release) <= 1
                   for c in problem.candidates)
        self.calls.append("coarse" if full else "full")
        return self.real(problem, exact, *args)


@pytest.fixture
def counted(monkeypatch):
    spy = _Counted(optimal_policy._bound)
    monkeypatch.setattr(optimal_policy, "_bound", spy)
    monkeypatch.setattr(optimal_policy, "EXACT_CANDIDATES", 0)  # the LP path on a small graph
    return spy


def _big():
    graph = residual_chain(6, activation_bytes=1 << 28, conv_flops=4e9)
    budget = int(reference_peaks(graph).liveness * 0.6)
    return graph, budget


def test_a_step_within_refine_above_of_the_coarse_bound_skips_the_full_model(counted):
    graph, budget = _big()
    coarse = lower_bound(graph, budget, COST, step=1e-12)  # below any bound: no refinement
    assert coarse is not None and counted.calls == ["coarse"]
    graph.meta.clear()
    counted.calls.clear()
    full = lower_bound(graph, budget, COST)  # no step: the full model too
    assert counted.calls == ["coarse", "full"]
    assert coarse <= full * (1 + 1e-12)


def test_a_cached_coarse_bound_is_refined_when_a_slower_plan_asks(counted):
    graph, budget = _big()
    first = lower_bound(graph, budget, COST, step=1e-12)
    assert first is not None
    again = lower_bound(graph, budget, COST, step=first * (1 + optimal_policy.REFINE_ABOVE / 2))
    assert counted.calls == ["coarse"]  # within REFINE_ABOVE: the cached coarse bound
    refined = lower_bound(graph, budget, COST, step=first * 2)
    assert counted.calls == ["coarse", "full"]
    assert again == first <= refined
    lower_bound(graph, budget, COST)
    assert counted.calls == ["coarse", "full"]  # the refined bound is cached
