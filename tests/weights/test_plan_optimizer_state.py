"""``outcore.plan(graph, optimizer=<built torch optimizer>)`` counts the bytes
``outcore.weights.optimizer.state_bytes`` counts (what ``outcore.compile`` budgets), which
are the bytes torch keeps after one step: one account (``outcore.weights.spec.STATE``) for
the plan and the run, for every optimizer case of test_optimizer_state.py, in fp32 and
bf16, built on ``parameters()`` or on ``named_parameters()``."""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_optimizer_state import CASES, captured_shapes, one_step, real_state_bytes

import outcore
from outcore.errors import InvalidArgumentError
from outcore.weights.optimizer import state_bytes
from outcore.weights.spec import graph_state_bytes


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def captured(request):
    return captured_shapes(request.param)


def planned_state(graph, optimizer, weights):
    """The optimizer state the plan counts: all on the device or all on the host."""
    planned = outcore.plan(graph, "100MB", optimizer=optimizer, weights=weights,
                           gpu="a100-40gb", cache=False)
    w = planned.weights
    assert (w.host_state if weights == "device" else w.device_state) == 0
    return w.device_state if weights == "device" else w.host_state


@pytest.mark.parametrize("named", [False, True], ids=["parameters", "named"])
@pytest.mark.parametrize("kind,options", CASES, ids=[f"{k}-{'-'.join(o)}" for k, o in CASES])
def test_the_plan_counts_what_state_bytes_and_torch_count(kind, options, named, captured):
    model, graph = captured
    model = copy.deepcopy(model)
    params = model.named_parameters() if named else model.parameters()
    optimizer = getattr(torch.optim, kind)(params, **options)
    sized = state_bytes(optimizer, model)
    assert graph_state_bytes(graph, optimizer) == sized
    total = sum(sized.values())
    assert planned_state(graph, optimizer, "device") == total
    assert planned_state(graph, optimizer, "host") == total
    one_step(model, optimizer)
    assert sum(real_state_bytes(optimizer, model).values()) == total


def momentum_groups(model, named):
    """SGD with momentum for the weights only: groups that keep different state."""
    pairs = list(model.named_parameters())
    weights = [(n, p) for n, p in pairs if p.dim() >= 2]
    rest = [(n, p) for n, p in pairs if p.dim() < 2]

    def group(members, momentum):
        params = members if named else [p for _, p in members]
        return {"params": params, "momentum": momentum}

    return torch.optim.SGD([group(weights, 0.9), group(rest, 0.0)], lr=0.1)


def test_groups_that_keep_different_state_are_sized_by_name(captured):
    model, graph = captured
    model = copy.deepcopy(model)
    optimizer = momentum_groups(model, named=True)
    sized = state_bytes(optimizer, model)
    assert graph_state_bytes(graph, optimizer) == sized
    assert planned_state(graph, optimizer, "device") == sum(sized.values())
    one_step(model, optimizer)
    real = real_state_bytes(optimizer, model)
    assert sized == {n: real.get(n, 0) for n in sized}
    assert sized["head.bias"] == 0 < sized["head.weight"]


def test_unnamed_groups_that_keep_different_state_are_refused_with_the_way_out(captured):
    model, graph = captured
    with pytest.raises(InvalidArgumentError, match="named_parameters"):
        outcore.plan(graph, "100MB", optimizer=momentum_groups(model, named=False),
                     gpu="a100-40gb", cache=False)


def test_a_name_the_graph_lacks_is_refused(captured):
    model, graph = captured
    optimizer = torch.optim.Adam([("other.weight", model.head.weight)])
    with pytest.raises(InvalidArgumentError, match=r"other\.weight"):
        graph_state_bytes(graph, optimizer)


def test_lbfgs_is_refused_by_the_plan_with_why(captured):
    model, graph = captured
    for params in (model.parameters(), model.named_parameters()):
        with pytest.raises(InvalidArgumentError, match="all the parameters together"):
            outcore.plan(graph, "100MB", optimizer=torch.optim.LBFGS(params),
                         gpu="a100-40gb", cache=False)


def test_adam_state_bytes_is_the_same_account(captured):
    """``choose.adam_state_bytes`` (for fake graphs) reads ``STATE`` too."""
    from outcore.weights.choose import adam_state_bytes

    model, graph = captured
    assert adam_state_bytes(graph) == state_bytes(torch.optim.Adam(model.parameters()), model)
