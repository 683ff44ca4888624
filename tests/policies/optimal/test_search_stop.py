"""The search's stopping rule (``planner.STOP_GAP``): once an integral solution's model step
is within ``STOP_GAP`` of the primal LP relaxation's value (a lower bound on the model's
optimum), the search stops: no seed is planned and no segment is re-solved. Without it the
segment search runs. The rule compares model steps only, so the plan stays deterministic."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies.optimal import build_problem, plan_optimal
from outcore.policies.optimal import formulation as optimal_formulation
from outcore.policies.optimal import planner as optimal_planner
from outcore.sim.synthetic import residual_chain

COST = cost_model_for("v100-pcie")
GRAPH = residual_chain(6, activation_bytes=1 << 28, conv_flops=4e9)
BUDGET = int(reference_peaks(GRAPH).liveness * 0.6)


class _Untouchable(Sequence[list[tuple]]):
    """Seeds that must not be read (planning them is what the rule saves)."""

    def __len__(self) -> int:
        raise AssertionError("the seeds were read")

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        raise AssertionError("the seeds were read")


class _Seeds(Sequence[list[tuple]]):
    """Seeds that record being read."""

    def __init__(self) -> None:
        self.read = False

    def __len__(self) -> int:
        self.read = True
        return 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        self.read = True
        raise IndexError(i)


#: A graph on which the segment pass improves the fractional MILP's solution (the model
#: step falls from 95.75 to 94.09 ms, the LP being 92.07 ms).
PASS_GRAPH = residual_chain(10, activation_bytes=1 << 28, conv_flops=4e9)
PASS_BUDGET = int(reference_peaks(PASS_GRAPH).liveness * 0.6)


def _model_and_lp(graph=GRAPH, budget=BUDGET):
    problem = build_problem(graph, COST, budget)
    model = optimal_formulation.Model(problem, relaxed=False)
    start = model.solve(integral=False)
    assert math.isfinite(start.objective)
    return model, start


def _count_solves(monkeypatch) -> list[dict]:
    calls: list[dict] = []
    real = optimal_formulation.Model.solve

    def spy(self, **kw):
        calls.append(kw)
        return real(self, **kw)
    monkeypatch.setattr(optimal_formulation.Model, "solve", spy)
    return calls


def test_the_search_stops_once_within_stop_gap_of_the_lp(monkeypatch):
    model, start = _model_and_lp()
    calls = _count_solves(monkeypatch)
    monkeypatch.setattr(optimal_planner, "STOP_GAP", 10.0)  # any integral solution is enough
    found = optimal_planner._search(model, start, None, _Untouchable())
    assert len(calls) == 1, "only the fractional MILP ran: no seed, no segment"
    assert found[0] is start
    best = min(s.objective for s in found[1:])
    assert best <= start.objective * (1 + 10.0)


def test_without_the_rule_the_segments_run_and_the_seeds_are_read(monkeypatch):
    model, start = _model_and_lp()
    calls = _count_solves(monkeypatch)
    monkeypatch.setattr(optimal_planner, "STOP_GAP", -1.0)  # never close enough
    seeds = _Seeds()
    optimal_planner._search(model, start, None, seeds)
    assert seeds.read
    segments = [kw for kw in calls if kw.get("cutoff") is not None]
    assert segments, "the segment search ran"


def test_a_stopped_search_is_never_better_than_the_full_one_on_the_model(monkeypatch):
    model, start = _model_and_lp()
    monkeypatch.setattr(optimal_planner, "STOP_GAP", -1.0)
    full = min(s.objective for s in optimal_planner._search(model, start, None, ())[1:])
    monkeypatch.setattr(optimal_planner, "STOP_GAP", 10.0)
    stopped = min(s.objective for s in optimal_planner._search(model, start, None, ())[1:])
    assert start.objective <= full * (1 + 1e-9) <= stopped * (1 + 1e-9)


@pytest.mark.parametrize("stop_gap", [0.0, 0.01, 10.0])
def test_the_plan_is_the_same_twice_at_any_stop_gap(monkeypatch, stop_gap):
    monkeypatch.setattr(optimal_planner, "STOP_GAP", stop_gap)
    first = plan_optimal(GRAPH, BUDGET, COST, exact_candidates=0, bound=False)
    again = plan_optimal(GRAPH, BUDGET, COST, exact_candidates=0, bound=False)
    assert first.plan.decisions, "the budget needs decisions (a non-trivial plan)"
    assert (first.plan.decisions, first.plan.prefetch_at, first.plan.release_at,
            first.step_time) == (again.plan.decisions, again.plan.prefetch_at,
                                 again.plan.release_at, again.step_time)


def test_plan_optimal_plans_no_seed_when_the_fractional_milp_is_close_enough(monkeypatch):
    monkeypatch.setattr(optimal_planner, "STOP_GAP", 10.0)

    def no_seeds(*args, **kwargs):
        raise AssertionError("the seed planners ran")
    monkeypatch.setattr(optimal_planner, "_seed_plans", no_seeds)
    result = plan_optimal(GRAPH, BUDGET, COST, exact_candidates=0, bound=False)
    assert result.plan.decisions


class _ListSeeds(Sequence[list[tuple]]):
    """Fixed seeds that record being read."""

    def __init__(self, seeds: list[list[tuple]]) -> None:
        self.seeds, self.read = seeds, False

    def __len__(self) -> int:
        self.read = True
        return len(self.seeds)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        self.read = True
        return self.seeds[i]


def test_the_seeds_are_not_read_when_the_first_segment_pass_meets_the_rule(monkeypatch):
    """The seeds come after the first segment pass: when that pass ends within STOP_GAP of
    the LP, no seed is planned (outcore-checkpoint's search is what this saves)."""
    model, start = _model_and_lp(PASS_GRAPH, PASS_BUDGET)
    monkeypatch.setattr(optimal_planner, "STOP_GAP", -1.0)
    full = optimal_planner._search(model, start, None, ())
    first_pass = min(s.objective for s in full[1:])
    frac = full[1].objective
    assert first_pass < frac, "the segment pass improves the fractional MILP on this graph"
    # a STOP_GAP that the pass meets and the fractional MILP does not
    gap = (first_pass / start.objective - 1 + frac / start.objective - 1) / 2
    monkeypatch.setattr(optimal_planner, "STOP_GAP", gap)
    seeds = _ListSeeds([[("keep",)] * len(model.p.candidates)])
    found = optimal_planner._search(model, start, None, seeds)
    assert not seeds.read
    assert min(s.objective for s in found[1:]) <= start.objective * (1 + gap)


def test_a_seed_better_than_the_fractional_milp_still_starts_a_segment_pass(monkeypatch):
    """When the rule never fires, a seed that beats the fractional MILP's solution is
    searched from as before: its own solution and the pass from it are both returned, so
    the search returns every solution the seeds-first order did."""
    model, start = _model_and_lp(PASS_GRAPH, PASS_BUDGET)
    monkeypatch.setattr(optimal_planner, "STOP_GAP", -1.0)
    plain = optimal_planner._search(model, start, None, ())
    best = min(plain[1:], key=lambda s: s.objective)
    seeds = _ListSeeds([best.choice])  # the best plan found, as a seed: it beats the MILP
    found = optimal_planner._search(model, start, None, seeds)
    assert seeds.read
    objectives = [s.objective for s in found[1:]]
    assert min(objectives) <= best.objective * (1 + 1e-9)
    assert len(found) >= len(plain) + 1, "the seed's own solution is among the tries"


def test_the_stop_gap_is_the_large_one_only_beyond_large_search(monkeypatch):
    model, _ = _model_and_lp()
    n = len(model.p.candidates)
    monkeypatch.setattr(optimal_planner, "LARGE_SEARCH", n)
    assert optimal_planner._stop_gap(model) == optimal_planner.STOP_GAP
    monkeypatch.setattr(optimal_planner, "LARGE_SEARCH", n - 1)
    assert optimal_planner._stop_gap(model) == optimal_planner.LARGE_STOP_GAP


def test_a_large_model_stops_at_the_large_gap(monkeypatch):
    """Above ``LARGE_SEARCH`` candidates the rule fires at ``LARGE_STOP_GAP``: with a
    ``STOP_GAP`` that never fires, the search still stops after the fractional MILP (no
    segment, no seed); below it the same ``STOP_GAP`` runs the segments."""
    model, start = _model_and_lp()
    monkeypatch.setattr(optimal_planner, "STOP_GAP", -1.0)
    monkeypatch.setattr(optimal_planner, "LARGE_STOP_GAP", 10.0)
    monkeypatch.setattr(optimal_planner, "LARGE_SEARCH", 0)
    calls = _count_solves(monkeypatch)
    found = optimal_planner._search(model, start, None, _Untouchable())
    assert len(calls) == 1, "only the fractional MILP ran: no seed, no segment"
    assert min(s.objective for s in found[1:]) <= start.objective * (1 + 10.0)
    monkeypatch.setattr(optimal_planner, "LARGE_SEARCH", len(model.p.candidates))
    calls.clear()
    seeds = _Seeds()
    optimal_planner._search(model, start, None, seeds)
    assert seeds.read and any(kw.get("cutoff") is not None for kw in calls)
