"""outcore-auto: fits any budget it can, moves nothing it need not, and prices its choices."""

import copy

import pytest
import torch

import outcore
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Decision
from outcore.policies.auto import plan_auto
from outcore.runtime.executor import Executor

from models import MODELS, make


class TableCost:
    """A hand-set cost model: every op takes ``op_s``; copies take ``bytes / bandwidth``."""

    copy_engines = 2

    def __init__(self, op_s: float, bandwidth: float) -> None:
        self.op_s, self.bandwidth = op_s, bandwidth

    def op_time(self, op):
        return 0.0 if op.category == "view" else self.op_s

    def transfer_time(self, nbytes, direction):
        return nbytes / self.bandwidth

    def bind(self, graph):  # needs nothing from the graph
        return self

    def workspace(self, op):
        return 0


def test_a_budget_above_the_in_core_peak_moves_nothing():
    model, loss_fn, batch = make("resnet")
    graph = outcore.capture(model, loss_fn, batch)
    plan, schedule = plan_auto(graph, reference_peaks(graph).liveness, TableCost(1e-3, 1e9))
    assert plan.decisions == {}
    assert predicted_peak(graph, schedule) == reference_peaks(graph).liveness


@pytest.mark.parametrize("name", [m for m in MODELS if m != "mlp"])
def test_fits_a_tighter_budget_with_eager_gradients(name):
    model, loss_fn, batch = make(name)
    reference = copy.deepcopy(model)
    graph = outcore.capture(model, loss_fn, batch)
    budget = int(reference_peaks(graph).liveness * 0.85)
    plan, schedule = plan_auto(graph, budget, TableCost(1e-4, 1e9))
    assert any(d is not Decision.KEEP for d in plan.decisions.values())
    torch.manual_seed(1)
    result = Executor(graph, schedule).run(batch)
    torch.manual_seed(1)
    loss_fn(reference(batch[0]), batch[1]).backward()
    assert result.peak_bytes == predicted_peak(graph, schedule) <= budget
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    assert all(plan.reasons[t] for t in plan.decisions)


def test_slow_link_prefers_recompute_fast_link_prefers_offload():
    model, loss_fn, batch = make("vgg")
    graph = outcore.capture(model, loss_fn, batch)
    budget = int(reference_peaks(graph).liveness * 0.85)
    slow, _ = plan_auto(graph, budget, TableCost(op_s=1e-6, bandwidth=1e3))
    fast, _ = plan_auto(graph, budget, TableCost(op_s=1.0, bandwidth=1e15))
    count = lambda plan, d: sum(1 for v in plan.decisions.values() if v is d)  # noqa: E731
    assert count(slow, Decision.RECOMPUTE) > count(slow, Decision.OFFLOAD)
    assert count(fast, Decision.OFFLOAD) > count(fast, Decision.RECOMPUTE)


def test_infeasible_budget_names_the_lowest_peak_reached():
    model, loss_fn, batch = make("vgg")
    graph = outcore.capture(model, loss_fn, batch)
    budget = reference_peaks(graph).layer_lower_bound
    with pytest.raises(InfeasibleBudgetError) as err:
        plan_auto(graph, budget // 2, TableCost(1e-3, 1e9))
    assert err.value.policy == "outcore-auto"
    assert err.value.required > budget // 2
