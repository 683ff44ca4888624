"""Issue 15 point 6: explain() names the instructions that bind the budget and, per tensor,
its decision's cost in seconds and the bytes it frees there; an infeasible budget is refused
with the lowest peak any plan reaches and what would lower it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import outcore
from outcore.graph.bounds import reference_peaks
from outcore.plan.memory import memory_curve
from outcore.plan.residency import resident_spans
from outcore.plan.schedule import Compute
from outcore.report.binding import EPSILON, binding
from outcore.report.explain import binding_line


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(*[nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
                                    for _ in range(4)])
        self.head = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x):
        return self.head(self.body(torch.relu(self.stem(x))).flatten(1))


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    batch = (torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,)))
    return outcore.capture(Net(), nn.functional.cross_entropy, batch)


def tight(graph, policy):
    """``policy``'s plan re-planned at its own peak: the budget binds with slack 0."""
    peaks = reference_peaks(graph)
    first = outcore.plan(graph, (peaks.liveness + peaks.layer_lower_bound) // 2, policy=policy,
                         gpu="v100-pcie", cache=False)
    return outcore.plan(graph, first.predicted_peak, policy=policy, gpu="v100-pcie",
                        cache=False)


@pytest.mark.parametrize("policy", ["superneurons", "auto"])
def test_binding_instructions_are_those_within_epsilon_of_the_budget(graph, policy):
    planned = tight(graph, policy)
    rows = planned.explain()
    device = memory_curve(planned.graph, planned.schedule).device
    near = planned.budget - int(EPSILON * planned.budget)
    assert rows.binds
    assert [b.index for b in rows.binding] == [i for i, m in enumerate(device) if m >= near]
    assert device.index(max(device)) in [b.index for b in rows.binding]
    for b in rows.binding:
        assert b.device == device[b.index]
        assert b.slack == planned.budget - b.device >= 0
    assert min(b.slack for b in rows.binding) == planned.budget - planned.predicted_peak
    assert binding_line(rows).startswith(f"the budget binds at {len(rows.binding)} instr")


@pytest.mark.parametrize("policy", ["superneurons", "auto"])
def test_each_tensor_frees_its_bytes_only_where_it_is_off_the_device(graph, policy):
    planned = tight(graph, policy)
    rows = planned.explain()
    by_name = {t.name: t for t in planned.graph.tensors}
    spans = resident_spans(planned.graph, planned.schedule)
    binding_at = {b.index for b in rows.binding}
    moved = 0
    for r in rows:
        t = by_name[r["tensor"]]
        assert set(r["binding_at"]) <= binding_at
        if r["decision"] == "keep":
            assert r["frees"] == 0 and r["binding_at"] == [] and r["cost_s"] == 0.0
            continue
        if r["frees"]:
            moved += 1
            assert r["frees"] == t.nbytes
            for i in r["binding_at"]:  # off the device there, by the replay's spans
                assert not any(s <= i < e for s, e in spans.get(t.id, []))
    assert moved, "a plan at a binding budget frees something at its binding instructions"


def test_costs_are_the_simulated_recompute_and_stall_seconds(graph):
    planned = tight(graph, "superneurons")
    sim, schedule = planned.simulation, planned.schedule
    rows = {r["tensor"]: r for r in planned.explain()}
    for t in planned.graph.activations():
        r = rows[t.name]
        if r["decision"] == "recompute":
            producer = planned.graph.producer_op(t.id).id
            spent = sum(sim.end[i] - sim.start[i] for i, ins in enumerate(schedule.instructions)
                        if isinstance(ins, Compute) and ins.recompute and ins.op == producer)
            assert spent > 0 and r["cost_s"] == pytest.approx(spent)
        elif r["decision"] == "offload":
            assert r["copy_s"] > 0 and r["cost_s"] >= 0


def test_without_a_binding_budget_the_peak_is_named(graph):
    planned = outcore.plan(graph, None, policy="liveness", gpu="v100-pcie", cache=False)
    found = binding(planned.graph, planned.schedule, None, planned.simulation)
    assert not found.binds and found.limit == planned.predicted_peak
    assert any(b.slack == 0 for b in found.instructions)
    roomy = binding(planned.graph, planned.schedule, 2 * planned.predicted_peak)
    assert not roomy.binds and roomy.limit == planned.predicted_peak


def test_an_infeasible_budget_names_the_lowest_peak_and_the_ways_out(graph):
    peaks = reference_peaks(graph)
    with pytest.raises(outcore.InfeasibleBudgetError) as info:
        outcore.plan(graph, peaks.layer_lower_bound + 1, policy="auto", gpu="v100-pcie",
                     cache=False)
    err = info.value
    assert err.lowest is not None and peaks.layer_lower_bound <= err.lowest < peaks.liveness
    text = str(err)
    assert "No plan that keeps, offloads or recomputes activations peaks below" in text
    assert "sub-batches" in text and "shrink the batch to about" in text and "(from 8)" in text
    # the floor is reached: a plan at exactly that budget is accepted, and none goes below
    at_floor = outcore.plan(graph, err.lowest, policy="auto", gpu="v100-pcie", cache=False)
    assert at_floor.predicted_peak <= err.lowest
    with pytest.raises(outcore.InfeasibleBudgetError):
        outcore.plan(graph, err.lowest - 1, policy="outcore-optimal", gpu="v100-pcie",
                     cache=False)


def test_a_budget_below_the_static_tensors_says_no_batch_fits(graph):
    static = reference_peaks(graph).static
    with pytest.raises(outcore.InfeasibleBudgetError) as info:
        outcore.plan(graph, static - 1, policy="auto", gpu="v100-pcie", cache=False)
    assert "static tensors alone exceed the budget" in str(info.value)


def test_a_policy_that_fails_above_the_floor_points_to_auto(graph):
    from outcore.refusal import ways_out

    peaks = reference_peaks(graph)
    budget = (peaks.liveness + peaks.layer_lower_bound) // 2
    text = ways_out(graph, budget, floor=peaks.layer_lower_bound, can_split=True)
    assert "this policy did not find one of them" in text and "policy='auto'" in text
    assert "shrink the batch" not in text  # no batch to shrink: plans fit this budget
