"""The CPU allocator's peak (profiler allocation events) never exceeds what outcore predicts
once kernel temporaries (measured per op, held by the memory rule during each Compute) are
on the graph: on zoo models under every policy (a representative slice by default, the
whole zoo x every policy as a slow test); and the measurement itself counts what it should."""

from __future__ import annotations

import pytest
import torch

from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.cost.measure_temporaries import (
    TEMPORARIES,
    allocator_peak_bound,
    measure_temporaries,
)
from outcore.errors import InfeasibleBudgetError, OutcoreError
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Plan
from outcore.plan.residency import no_workspace
from outcore.policies import registry
from outcore.policies.registry import PolicyContext
from outcore.runtime.devices.allocator_peak import allocator_peak
from outcore.runtime.executor import Executor


def test_counts_allocations_and_leaves_out_gradients():
    layer = torch.nn.Linear(256, 256)
    x = torch.randn(128, 256)

    def step():
        layer(x).relu().sum().backward()

    step()
    layer.weight.grad = layer.bias.grad = None
    result = allocator_peak(step, lambda: [layer.weight.grad, layer.bias.grad])
    out = 128 * 256 * 4
    assert result.peak >= 2 * out  # the linear's and the relu's outputs at once
    assert result.excluded == (256 * 256 + 256) * 4
    assert result.held_at_end == 0


def test_conv_backward_temporaries_are_measured_and_held_by_the_memory_rule():
    w = zoo.get("resnet20-cifar", 4, small=True)
    graph = capture(w.model, w.loss_fn, w.batch)
    schedule = lower(graph, Plan("in-core"))
    tensors_only = memory_curve(graph, schedule).peak
    temps = measure_temporaries(graph, w.batch)
    assert graph.meta[TEMPORARIES] == temps == [op.temporaries for op in graph.ops]
    conv_bwd = [t for op, t in zip(graph.ops, temps, strict=True)
                if "convolution_backward" in op.target]
    assert conv_bwd and max(conv_bwd) > 0
    assert all(t == 0 for op, t in zip(graph.ops, temps, strict=True) if op.category == "view")
    with_temps = memory_curve(graph, schedule)
    assert with_temps.peak > tensors_only  # the rule now holds them
    assert memory_curve(graph, schedule, no_workspace).peak == tensors_only


POLICIES = registry.names()
SLICE = [("resnet20-cifar", p) for p in ("liveness", "outcore-checkpoint", "outcore-auto",
                                          "vdnn-all", "superneurons")] + \
        [("transformer", p) for p in ("liveness", "outcore-checkpoint", "recompute-cheap",
                                      "outcore-auto")] + \
        [("vgg11", p) for p in ("liveness", "recompute-cheap", "pooch")] + \
        [("mlp", "outcore-auto"), ("alexnet", "pooch")]  # pooch: a re-search out of reach
OPTIONS = {"transformer": {"tie_weights": False}}
_graphs: dict[str, tuple[object, object]] = {}


def _measured(name: str):
    if name not in _graphs:
        w = zoo.get(name, 4, small=True, **OPTIONS.get(name, {}))
        graph = capture(w.model, w.loss_fn, w.batch)
        measure_temporaries(graph, w.batch)
        _graphs[name] = (w, graph)
    return _graphs[name]


def check_allocator_within_prediction(name: str, policy: str) -> None:
    w, graph = _measured(name)
    in_core = memory_curve(graph, lower(graph, Plan("in-core")))
    budget = in_core.static + (in_core.peak - in_core.static) * 3 // 4
    try:
        out = registry.get(policy).fn(graph, PolicyContext(budget=budget,
                                                           cost=cost_model_for("this-cpu")))
    except InfeasibleBudgetError as exc:  # the policy cannot reach this budget
        assert exc.required > budget
        return
    except OutcoreError as exc:  # the policy does not take this model: nothing to run
        pytest.skip(f"{policy} on {name}: {exc}")
    executor = Executor(out.graph, out.schedule)
    executor.run(w.batch, apply=False)  # warm up
    measured = allocator_peak(lambda: executor.run(w.batch, apply=False)).peak
    assert measured <= allocator_peak_bound(out.graph, out.schedule), (name, policy)


@pytest.mark.parametrize("name,policy", SLICE)
def test_allocator_peak_never_exceeds_the_prediction(name, policy):
    check_allocator_within_prediction(name, policy)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", zoo.names())
def test_allocator_peak_never_exceeds_the_prediction_whole_zoo(name, policy):
    check_allocator_within_prediction(name, policy)


def test_trainer_on_cpu_reports_the_allocators_peak_within_the_plan():
    w = zoo.get("resnet20-cifar", 4, small=True)
    graph = capture(w.model, w.loss_fn, w.batch)
    measure_temporaries(graph, w.batch)
    in_core = memory_curve(graph, lower(graph, Plan("in-core")))
    # within recomputation's reach (below it the plan offloads into the same RAM, and the
    # allocator rightly counts those host copies too)
    budget = in_core.static + (in_core.peak - in_core.static) * 9 // 10
    import outcore

    trainer = outcore.compile(w.model, w.loss_fn, w.batch, budget=budget, device="cpu")
    assert any(op.temporaries for op in trainer.planned.graph.ops)
    trainer.step(*w.batch)
    stats = trainer.stats
    assert trainer.plan.decisions and not any(
        i for i in trainer.planned.schedule.instructions if type(i).__name__ == "Offload")
    assert stats.tensor_peak < stats.measured_peak <= stats.predicted_peak <= budget
