"""outcore-optimal's plan does not depend on the machine's load: every HiGHS solve is
bounded in branch-and-bound nodes, never in seconds, so planning the same input twice, once
with a CPU-burning thread beside it, gives the identical plan and schedule."""

import threading

import numpy as np
import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies.optimal import plan_optimal
from outcore.policies.optimal import planner as optimal_planner
from outcore.sim.synthetic import residual_chain


def _fingerprint(result):
    plan = result.plan
    return (sorted(plan.decisions.items()), sorted(plan.prefetch_at.items()),
            sorted(plan.release_at.items()), list(result.schedule.instructions),
            result.step_time, result.lower_bound)


class _Burner:
    """Keeps a core busy with numpy matrix products (they release the GIL, so the burner
    competes with HiGHS for the CPU rather than only for the interpreter)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self._burn, daemon=True)

    def _burn(self) -> None:
        a = np.random.default_rng(0).random((300, 300))
        while not self.stop.is_set():
            a = np.tanh(a @ a)
            self.rounds += 1

    def __enter__(self) -> "_Burner":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("exact_candidates", [80, 0], ids=["exact-milp", "lp-and-search"])
def test_the_same_input_gives_the_same_plan_idle_and_under_load(exact_candidates):
    graph = residual_chain(6, activation_bytes=1 << 28, conv_flops=4e9)
    cost = cost_model_for("v100-pcie")
    budget = int(reference_peaks(graph).liveness * 0.6)
    first = plan_optimal(graph, budget, cost, exact_candidates=exact_candidates)
    again = plan_optimal(graph, budget, cost, exact_candidates=exact_candidates)
    with _Burner() as burner:
        loaded = plan_optimal(graph, budget, cost, exact_candidates=exact_candidates)
    assert burner.rounds > 0, "the burner ran while the plan was made"
    assert _fingerprint(first) == _fingerprint(again) == _fingerprint(loaded)
    assert first.plan.decisions, "the budget needs decisions (a non-trivial plan)"


def test_no_solve_is_given_a_wall_clock_limit(monkeypatch):
    """Every HiGHS call outcore-optimal makes names no ``time_limit`` (the plan would then
    depend on how fast the machine was at that moment)."""
    from outcore.policies.optimal import formulation

    seen: list[dict] = []
    real = formulation.milp

    def spy(*args, **kwargs):
        seen.append(dict(kwargs.get("options") or {}))
        return real(*args, **kwargs)

    monkeypatch.setattr(formulation, "milp", spy)
    graph = residual_chain(4, activation_bytes=1 << 28, conv_flops=4e9)
    cost = cost_model_for("a100")
    budget = int(reference_peaks(graph).liveness * 0.6)
    for exact in (80, 0):
        plan_optimal(graph, budget, cost, exact_candidates=exact)
    assert seen and all("time_limit" not in opts for opts in seen)
    assert any(opts.get("node_limit") == optimal_planner.EXACT_NODES for opts in seen)
    assert any(opts.get("node_limit") == optimal_planner.NODE_LIMIT for opts in seen)
