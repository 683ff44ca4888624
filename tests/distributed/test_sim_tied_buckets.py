"""The simulator's gradient buckets are the runtime's: a tied parameter (the transformer's LM
head sharing the token embedding's weight) takes one slot, as ``BucketLayout`` gives it.

Before: ``simulate_data_parallel`` assigned the buckets without the tied groups, so the
shared weight's gradient was all-reduced (and its bucket bytes counted) twice: 120320
all-reduced bytes for the small transformer whose parameters hold 112128.
"""

from __future__ import annotations

import pytest

import outcore
from outcore import zoo
from outcore.api import cost_model_for
from outcore.cost.interconnects import get_host
from outcore.distributed.layout import BucketLayout, tied_names
from outcore.plan.grad_buckets import assign_buckets, graph_tied_gradients, tied_gradients
from outcore.plan.weights import gradients, tied_parameters
from outcore.sim.multi_gpu import rank_cost_model, simulate_data_parallel

HOST = get_host("dgx1-v100")


@pytest.fixture(scope="module")
def tied_step():
    work = zoo.get("transformer", 4, small=True)
    graph = outcore.capture(work.model, work.loss_fn, work.batch)
    planned = outcore.plan(graph, None, policy="liveness", simulate=False, cache=False)
    return work.model, planned.graph, planned.schedule


def runtime_buckets(model, graph, schedule, cap):
    """The buckets a data-parallel rank all-reduces: assigned with the model's tied groups
    and laid out by parameter (``BucketLayout``), as ``outcore.distributed`` does."""
    tied = tied_names(model)
    first = assign_buckets(graph, schedule, cap, tied_gradients(graph, tied))
    return BucketLayout.of(graph, first, tied).buckets(graph, schedule)


def test_the_graph_knows_the_tied_groups_the_model_has(tied_step):
    model, graph, _ = tied_step
    assert tied_names(model) == [("tok.weight", "head.weight")]
    assert tied_parameters(graph) == [("tok.weight", "head.weight")]
    assert graph_tied_gradients(graph) == [tuple(g) for g in
                                           tied_gradients(graph, tied_names(model))]
    assert len(gradients(graph)) == len(list(model.parameters())) + 1  # one per name


@pytest.mark.parametrize("cap", [None, 4096, 8192], ids=["ddp-cap", "4KiB", "8KiB"])
def test_simulated_buckets_are_the_runtime_buckets(tied_step, cap):
    model, graph, schedule = tied_step
    cost = rank_cost_model(cost_model_for(HOST.gpu).profile, HOST, 2)
    result = simulate_data_parallel(graph, schedule, cost, HOST, 2, bucket_cap=cap)
    runtime = runtime_buckets(model, graph, schedule, cap or 25 << 20)
    assert [(b.nbytes, b.ready_at) for b in result.buckets] == \
        [(b.nbytes, b.ready_at) for b in runtime]
    distinct = sum(p.nbytes for p in model.parameters())  # the tied weight once
    assert result.allreduce_bytes == sum(b.nbytes for b in runtime) == distinct
    if cap is not None:
        assert len(result.buckets) > 1


def test_without_the_groups_the_tied_weight_counts_twice(tied_step):
    """What the fix removes: ``tied=()`` folds nothing (the old assignment)."""
    model, graph, schedule = tied_step
    cost = rank_cost_model(cost_model_for(HOST.gpu).profile, HOST, 2)
    folded = simulate_data_parallel(graph, schedule, cost, HOST, 2)
    unfolded = simulate_data_parallel(graph, schedule, cost, HOST, 2, tied=())
    assert unfolded.allreduce_bytes - folded.allreduce_bytes == model.tok.weight.nbytes
    assert folded.comm_time < unfolded.comm_time


def test_an_untied_model_has_no_groups():
    work = zoo.get("mlp", 8, small=True)
    graph = outcore.capture(work.model, work.loss_fn, work.batch)
    assert tied_names(work.model) == [] == tied_parameters(graph) == graph_tied_gradients(graph)


def test_plan_gpus_allreduces_the_tied_weight_once(capsys):
    """``outcore plan --gpus 2``: its all-reduced bytes (and the buckets its rank's plan
    fits beside it) count the tied weight once."""
    import json

    from outcore.cli import EXIT_OK, main

    code = main(["--json", "plan", "--model", "transformer", "--small", "--batch", "8",
                 "--budget", "64MB", "--policy", "liveness", "--gpus", "2",
                 "--host", "dgx1-v100"])
    captured = capsys.readouterr()
    assert code == EXIT_OK, captured.err
    work = zoo.get("transformer", 4, small=True)
    assert json.loads(captured.out)["allreduce_bytes"] == sum(
        p.nbytes for p in work.model.parameters())
