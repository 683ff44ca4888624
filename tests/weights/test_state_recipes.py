"""The optimizer state outcore predicts is the state that gets allocated, in fp32 and bf16,
for both recipes (``outcore.weights.spec``'s module doc):

* ``outcore plan --optimizer`` predicts what ``outcore run --optimizer`` builds: the torch
  optimizer on the model's own parameters, its state in their dtype, no masters. Before,
  the plan counted fp32 state plus fp32 masters: for the bf16 ``Shapes`` model 10544
  bytes where its AdamW keeps 3536, and 3504 for SGD without momentum, which keeps none;
* the named specs ("adamw", ...) predict the mixed-precision recipe: the optimizer built
  on ``MasterWeights``, fp32 state plus the fp32 masters of the bf16 parameters.

Measured: the sum of ``nbytes`` of the tensors in ``optimizer.state`` after one step, plus
the masters where they exist.
"""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_optimizer_state import CASES, Shapes, captured_shapes, one_step, squared_error

import outcore
from outcore import cli_workload
from outcore.cli import build_parser
from outcore.weights.mixed import MasterWeights, eager_step
from outcore.weights.optimizer import state_bytes
from outcore.weights.spec import SPECS, graph_state_bytes, torch_spec

DTYPES = [torch.float32, torch.bfloat16]




@pytest.fixture(scope="module", params=DTYPES, ids=["fp32", "bf16"])
def captured(request):
    return captured_shapes(request.param)


def measured(optimizer, masters=None):
    """Bytes torch keeps for ``optimizer`` (after a step), plus the masters if any."""
    state = sum(v.nbytes for s in optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    return state + (sum(m.nbytes for m in masters.parameters()) if masters else 0)


CLI = [("adamw", None, None), ("adam", None, None), ("adamw", None, 0.1),
       ("sgd", None, None), ("sgd", 0.9, None), ("sgd", 0.9, 0.01)]


@pytest.mark.parametrize("name,momentum,decay", CLI,
                         ids=[f"{n}-m{m}-wd{d}" for n, m, d in CLI])
def test_cli_plan_predicts_the_state_cli_run_allocates(name, momentum, decay, captured):
    model, graph = captured
    model = copy.deepcopy(model)
    flags = ["--model", "mlp", "--optimizer", name]
    flags += ["--momentum", str(momentum)] if momentum is not None else []
    flags += ["--weight-decay", str(decay)] if decay is not None else []
    plan_args, run_args = (build_parser().parse_args([command, *flags])
                           for command in ("plan", "run"))
    predicted = graph_state_bytes(graph, cli_workload.optimizer_spec(plan_args))
    optimizer = cli_workload.optimizer_for(run_args, model.parameters())  # what `run` builds
    assert predicted == state_bytes(optimizer, model)  # what `run` budgets
    one_step(model, optimizer)
    assert sum(predicted.values()) == measured(optimizer)
    if name != "sgd" or momentum:
        assert measured(optimizer) > 0


@pytest.mark.parametrize("name", sorted(SPECS))
def test_named_specs_predict_the_mixed_precision_recipe(name, captured):
    """The optimizer on fp32 masters of a bf16 model (``MasterWeights``); an fp32 model
    needs no masters, and the optimizer is built on its own parameters."""
    model, graph = captured
    model = copy.deepcopy(model)
    kind, options = {"adamw": ("AdamW", {}), "adam": ("Adam", {}),
                     "sgd": ("SGD", {"lr": 0.1, "momentum": 0.9})}[name]
    low = model.head.weight.dtype != torch.float32
    masters = MasterWeights(model) if low else None
    params = masters.parameters() if masters else model.parameters()
    optimizer = getattr(torch.optim, kind)(params, **options)
    predicted = graph_state_bytes(graph, name)
    assert predicted == state_bytes(optimizer, model, masters)  # what compile budgets
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    loss = model(x.to(model.head.weight.dtype)).square().mean()
    if masters:
        eager_step(model, masters, optimizer, loss)
    else:
        loss.backward()
        optimizer.step()
    assert sum(predicted.values()) == measured(optimizer, masters)


@pytest.mark.parametrize("kind,options", CASES, ids=[f"{k}-{'-'.join(o)}" for k, o in CASES])
def test_every_optimizer_on_the_models_own_parameters(kind, options, captured):
    """``torch_spec(kind, own_dtype=True, master=False)``: the state in the parameters'
    dtype, no masters, for every optimizer ``STATE`` knows."""
    model, graph = captured
    model = copy.deepcopy(model)
    optimizer = getattr(torch.optim, kind)(model.parameters(), **options)
    spec = torch_spec(kind, optimizer.param_groups[0], own_dtype=True, master=False)
    predicted = graph_state_bytes(graph, spec)
    one_step(model, optimizer)
    assert sum(predicted.values()) == measured(optimizer)


@pytest.mark.parametrize("kind,options", CASES, ids=[f"{k}-{'-'.join(o)}" for k, o in CASES])
def test_every_optimizer_on_fp32_masters(kind, options):
    """``torch_spec(kind)`` (the mixed-precision recipe) on a bf16 model: the state of the
    optimizer built on its ``MasterWeights``, plus the masters."""
    torch.manual_seed(0)
    model = Shapes().to(torch.bfloat16)
    x = torch.randn(2, 3, 8, 8, dtype=torch.bfloat16)
    graph = outcore.capture(model, squared_error, (x, torch.zeros(2, 5, dtype=torch.bfloat16)))
    masters = MasterWeights(model)
    optimizer = getattr(torch.optim, kind)(masters.parameters(), **options)
    predicted = graph_state_bytes(graph, torch_spec(kind, optimizer.param_groups[0]))
    assert predicted == state_bytes(optimizer, model, masters)
    eager_step(model, masters, optimizer, model(x).square().mean())
    assert sum(predicted.values()) == measured(optimizer, masters)
