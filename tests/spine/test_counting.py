"""Counting: a recompute really runs the op again, and only the ops the plan chose."""

import copy
from collections import Counter

import torch

from outcore.capture import capture
from outcore.plan.lower import lower
from outcore.plan.plan import Decision, Plan
from outcore.policies import baseline
from outcore.runtime.executor import Executor

from models import make


def counting_impls(graph, counter):
    impls = {}
    for oid, node in enumerate(graph.source.op_nodes):
        def wrapped(*args, _f=node.target, _o=oid, **kwargs):
            counter[_o] += 1
            return _f(*args, **kwargs)
        impls[oid] = wrapped
    return impls


def test_recompute_runs_exactly_the_planned_ops():
    model, loss_fn, batch = make("vgg")
    graph = capture(model, loss_fn, batch)
    plan = baseline.recompute_cheap(graph)
    schedule = lower(graph, plan)
    counter: Counter = Counter()
    Executor(graph, schedule, impls=counting_impls(graph, counter)).run(batch)
    planned = Counter(schedule.recomputed_ops())
    assert planned, "recompute-cheap must recompute something on a VGG chain"
    for op in graph.ops:
        assert counter[op.id] == 1 + planned[op.id], op.name
    recomputed_producers = {graph.tensors[t].producer
                            for t in plan.tensors_with(Decision.RECOMPUTE)}
    assert recomputed_producers <= set(planned), "every recomputed tensor's producer reruns"


def test_keep_plan_recomputes_nothing():
    model, loss_fn, batch = make("inception")
    graph = capture(model, loss_fn, batch)
    counter: Counter = Counter()
    Executor(graph, lower(graph, baseline.liveness(graph)),
             impls=counting_impls(graph, counter)).run(batch)
    assert set(counter.values()) == {1}
    assert len(counter) == len(graph.ops)


def test_recomputed_dropout_replays_its_mask():
    model, loss_fn, batch = make("transformer")
    reference = copy.deepcopy(model)
    graph = capture(model, loss_fn, batch)
    dropouts = [op for op in graph.ops if op.random]
    assert dropouts, "the transformer block has dropout"
    plan = Plan(policy="recompute-dropout")
    for op in dropouts:
        for t in op.outputs:
            if t in {a.id for a in graph.activations()}:
                plan.decisions[t] = Decision.RECOMPUTE
    schedule = lower(graph, plan)
    assert {op.id for op in dropouts} & set(schedule.recomputed_ops())
    torch.manual_seed(3)
    Executor(graph, schedule).run(batch)
    torch.manual_seed(3)
    loss_fn(reference(batch[0]), batch[1]).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
