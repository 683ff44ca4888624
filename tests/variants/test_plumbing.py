"""Variants end to end: the plan names them, the executor runs them, the simulator and the
memory rule charge their workspace, and an impossible one is refused at planning time."""

import copy

import pytest
import torch
from torch import nn

import outcore
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Plan
from outcore.runtime.executor import Executor
from outcore.sim import simulate
from outcore.variants.errors import VariantUnsupported


def net():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.ReLU(),
                          nn.Flatten(), nn.Linear(8 * 8 * 8, 4)).double()
    batch = (torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.tensor([0, 3]))
    return model, nn.functional.cross_entropy, batch


def conv_ops(graph, variant):
    return [op.id for op in graph.ops
            if variant in op.variant_options and "refused" not in op.variant_options[variant]]


@pytest.mark.parametrize("variant", ["im2col", "fft"])
def test_executor_runs_variant_and_peak_includes_workspace(variant):
    model, loss_fn, batch = net()
    reference = copy.deepcopy(model)
    loss_fn(reference(batch[0]), batch[1]).backward()
    graph = outcore.capture(model, loss_fn, batch)
    chosen = conv_ops(graph, variant)
    assert chosen, "the ungrouped conv and its backward accept the variant"
    schedule = lower(graph, Plan(policy="variants", variants=dict.fromkeys(chosen, variant)))
    plain = lower(graph, Plan(policy="framework"))
    result = Executor(graph, schedule).run(batch)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12)
    assert result.peak_bytes == predicted_peak(graph, schedule)
    assert predicted_peak(graph, schedule) > predicted_peak(graph, plain), "workspace is charged"
    cost = AnalyticCostModel(get_profile("v100-pcie"))
    with_variant, without = simulate(graph, schedule, cost), simulate(graph, plain, cost)
    assert with_variant.peak_bytes == predicted_peak(graph, schedule)
    from outcore.cost.measured import MeasuredProfile

    measured = MeasuredProfile.for_graph(graph, [1e-3] * len(graph.ops)).with_link(1e9)
    assert simulate(graph, schedule, measured).peak_bytes == predicted_peak(graph, schedule)
    speeds = [graph.ops[o].variant_options[variant]["speed"] for o in chosen]
    if all(s > 1 for s in speeds):
        assert with_variant.compute_time > without.compute_time


def test_impossible_variant_is_refused_at_planning_time_with_reason():
    model, loss_fn, batch = net()
    graph = outcore.capture(model, loss_fn, batch)
    grouped = [op.id for op in graph.ops if "refused" in op.variant_options.get("fft", {})]
    assert grouped
    with pytest.raises(VariantUnsupported, match="grouped convolution"):
        lower(graph, Plan(policy="bad", variants={grouped[0]: "fft"}))
    with pytest.raises(VariantUnsupported, match="no such variant"):
        lower(graph, Plan(policy="bad", variants={grouped[0]: "winograd"}))
