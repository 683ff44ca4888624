"""Issue 15 points 3 and 5: the planner table and the measured check run in quick mode; the
torch knapsack's plans fit; measured peaks equal predicted ones (never speed here)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import planner_measured
import planner_table
from torch_knapsack import torch_knapsack_plan

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision
from outcore.plan.schedule import Compute, Schedule
from outcore.plan.verify import verify
from outcore.policies.optimal import floor


def test_planner_table_quick_row(capsys):
    (res,) = planner_table.main(["--quick"])
    out = capsys.readouterr().out
    assert "| quick |" in out and "Planning seconds" in out
    assert set(res.steps) == set(planner_table.COLUMNS)
    assert res.steps["in-core"] > 0 and res.bound is not None
    fitting = [s for c, s in res.steps.items() if c in planner_table.SEEDS and s is not None]
    assert fitting, "some seed policy fits half the in-core peak of this model"
    # outcore-auto's portfolio holds every seed (framework kernels, as here)
    assert res.steps["outcore-auto"] <= min(fitting) * (1 + 1e-9)
    # no plan built by outcore.plan.lower beats the bound; in-core is below every plan
    for column in ("greedy", "outcore-optimal", "torch-knapsack"):
        if res.steps[column] is not None:
            assert res.steps[column] >= res.bound * (1 - 1e-9)
    assert res.bound >= res.steps["in-core"] * (1 - 1e-9)


def test_torch_knapsack_plans_recompute_only_and_fit():
    row = planner_table.QUICK[0]
    graph = planner_table.graph_of(row)
    cost = cost_model_for(row.gpu)
    peak = reference_peaks(graph).liveness
    roomy = torch_knapsack_plan(graph, peak, cost)
    assert roomy is not None and roomy.fraction == 1.0 and not roomy.plan.decisions
    found = torch_knapsack_plan(graph, int(0.8 * peak), cost)
    assert found is not None and 0 <= found.fraction < 1
    assert set(found.plan.decisions.values()) == {Decision.RECOMPUTE}
    verify(graph, found.schedule)
    assert memory_curve(graph, found.schedule).peak == found.peak <= int(0.8 * peak)
    lowest = floor(graph, cost)
    assert torch_knapsack_plan(graph, lowest - 1, cost) is None


def test_rank_agreement_helpers():
    assert planner_measured.ranks([3.0, 1.0, 3.0]) == [1.5, 0.0, 1.5]
    assert planner_measured.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert planner_measured.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert math.isnan(planner_measured.spearman([1], [2]))
    assert planner_measured.pairwise([1, 2, 3], [1, 3, 2]) == 2 / 3
    assert planner_measured.pairwise([1, 2], [1.0, 1.01]) == 1.0  # a measured tie agrees


def test_planner_measured_quick_peaks_equal_predicted(capsys):
    cases = planner_measured.main(["--quick", "--repeats", "1"])
    assert len(cases) == 1 and len(cases[0].entries) >= 2
    for e in cases[0].entries:
        assert e.measured_peak == e.predicted <= cases[0].budget, e.policy
        assert len(e.seconds) == 1
    assert "| resnet20-cifar |" in capsys.readouterr().out


def _entry(policy, simulated, seconds, same=False):
    schedule = Schedule(instructions=[])
    return planner_measured.Entry(policy, Graph([], [], []), schedule, 0, simulated, list(seconds),
                                  same_as_auto=same)


def test_paired_verdicts_leave_out_same_plans_and_count_resolved_pairs():
    rounds = 9
    auto = _entry("outcore-auto", 1.0, [1.0 + 0.01 * i for i in range(rounds)])
    slow = _entry("dymem", 2.0, [2.0 + 0.01 * i for i in range(rounds)])
    # a "seed" that is auto's own plan, measured faster by noise: left out of the verdicts
    twin = _entry("pooch", 1.0, [0.9 + 0.01 * i for i in range(rounds)], same=True)
    # a distinct plan the simulator ranks after auto but measured resolved faster
    wrong = _entry("modnn", 1.5, [0.8 + 0.01 * i for i in range(rounds)])
    case = planner_measured.Case("m", 0.5, 1, [auto, slow, twin, wrong], [])
    assert [e.policy for e in case.seeds()] == ["dymem", "modnn"]
    assert case.versus_auto(slow).verdict == "faster"
    assert not case.auto_not_slower()  # modnn is resolved faster than auto
    resolved, agree, unlike = case.resolved_pairs()
    assert (resolved, agree) == (3, 2)  # auto<dymem, modnn<dymem agree; auto vs modnn not
    assert unlike == ["modnn < outcore-auto"]
    case.entries.remove(wrong)
    assert case.auto_not_slower()


def test_same_program_compares_instructions_and_kernels():
    a = Schedule(instructions=[Compute(0)])
    assert planner_measured.same_program(a, Schedule(instructions=[Compute(0)]))
    assert not planner_measured.same_program(a, Schedule(instructions=[Compute(1)]))
    assert not planner_measured.same_program(a, Schedule(instructions=[Compute(0)],
                                                         variants={0: "x"}))
