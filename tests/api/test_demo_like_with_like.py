"""``make demo`` compares like with like: every policy's plan on the framework's kernels."""

from __future__ import annotations

import pytest

from outcore import zoo
from outcore.api import cost_model_for, plan
from outcore.capture import capture
from outcore.demo import framework_kernels
from outcore.graph.bounds import reference_peaks
from outcore.plan.memory import memory_curve


@pytest.fixture(scope="module")
def graph():
    w = zoo.get("resnet20-cifar", 8, small=True)
    return capture(w.model, w.loss_fn, w.batch)


@pytest.fixture(scope="module")
def vdnn(graph):
    budget = reference_peaks(graph).liveness
    planned = plan(graph, budget, policy="vdnn-all-p", cost=cost_model_for("v100-pcie"),
                   cache=False)
    assert planned.schedule.variants, "vDNN's performance-optimal plan picks variants"
    return planned, budget


def test_variants_are_dropped_and_the_plan_re_simulated(vdnn, graph):
    cost = cost_model_for("v100-pcie")
    planned, budget = vdnn
    same = framework_kernels(planned, budget, cost)
    assert same is not None
    assert not same.schedule.variants and not same.plan.variants
    assert same.predicted_peak == memory_curve(graph, same.schedule).peak <= budget
    assert same.simulation.step_time != planned.simulation.step_time


def test_a_plan_without_variants_is_returned_as_is(graph):
    cost = cost_model_for("v100-pcie")
    budget = reference_peaks(graph).liveness // 2
    planned = plan(graph, budget, policy="outcore-auto", cost=cost, cache=False)
    assert not planned.schedule.variants
    assert framework_kernels(planned, budget, cost) is planned


def test_a_plan_that_no_longer_fits_on_framework_kernels_is_refused(vdnn):
    planned, _ = vdnn
    assert framework_kernels(planned, 1, cost_model_for("v100-pcie")) is None


def test_the_fastest_line_puts_outcore_auto_first_on_a_tie():
    from outcore.demo import _fastest

    line = _fastest({"pooch": 0.0414, "outcore-auto": 0.04140001, "vdnn-all": 0.0478},
                    "v100-pcie")
    assert "[bold]outcore-auto[/bold] (41.4 ms" in line and "tied within 0.1% with pooch" in line
    slower = _fastest({"pooch": 0.0400, "outcore-auto": 0.0414}, "v100-pcie")
    assert "[bold]pooch[/bold]" in slower and "outcore-auto 41.4 ms" in slower
