"""The CPU allocator's peak (profiler allocation events) never exceeds what outcore predicts
once kernel temporaries (measured per op) and saved RNG states are counted, on zoo models
under several policies; and the measurement itself counts what it should."""

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
from outcore.errors import InfeasibleBudgetError
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Plan
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


def test_conv_backward_temporaries_are_measured():
    w = zoo.get("resnet20-cifar", 4, small=True)
    graph = capture(w.model, w.loss_fn, w.batch)
    temps = measure_temporaries(graph, w.batch)
    assert graph.meta[TEMPORARIES] == temps
    conv_bwd = [t for op, t in zip(graph.ops, temps, strict=True)
                if "convolution_backward" in op.target]
    assert conv_bwd and max(conv_bwd) > 0
    assert all(t == 0 for op, t in zip(graph.ops, temps, strict=True) if op.category == "view")


@pytest.mark.parametrize("name,opts", [
    ("resnet20-cifar", {}),
    ("transformer", {"tie_weights": False}),
    ("vgg11", {}),
    ("mlp", {}),
])
def test_allocator_peak_never_exceeds_the_prediction(name, opts):
    w = zoo.get(name, 4, small=True, **opts)
    graph = capture(w.model, w.loss_fn, w.batch)
    temps = measure_temporaries(graph, w.batch)
    in_core = memory_curve(graph, lower(graph, Plan("in-core")))
    budget = in_core.static + (in_core.peak - in_core.static) * 3 // 4
    cost = cost_model_for("this-cpu")
    for policy in ("liveness", "outcore-checkpoint", "recompute-cheap", "outcore-auto"):
        try:
            out = registry.get(policy).fn(graph, PolicyContext(budget=budget, cost=cost))
        except InfeasibleBudgetError as exc:  # a recompute-only policy on a small model
            assert policy != "liveness" and exc.required > budget
            continue
        executor = Executor(out.graph, out.schedule)
        executor.run(w.batch, apply=False)  # warm up
        measured = allocator_peak(lambda ex=executor: ex.run(w.batch, apply=False)).peak
        assert measured <= allocator_peak_bound(out.graph, out.schedule), policy
