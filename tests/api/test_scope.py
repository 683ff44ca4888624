"""``outcore.plan(..., scope="activations")``: the budget bounds the activations only
(parameters, buffers, inputs and the parameters' gradients left out), as PyTorch's
``activation_memory_budget`` scopes its own; ``scope="step"`` (the default) is unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

import outcore
from outcore import zoo
from outcore.api import PlannedStep
from outcore.capture import capture
from outcore.cost.measure_temporaries import measure_temporaries
from outcore.errors import InfeasibleBudgetError, InvalidArgumentError
from outcore.graph.ir import TensorKind
from outcore.plan.memory import memory_curve
from outcore.plan.residency import TRANSIENT, no_workspace, residency_steps
from outcore.plan.schedule import Compute
from outcore.plan.scope import SCRATCH, scoped_curve
from outcore.runtime.devices.allocator_peak import allocator_peak
from outcore.runtime.devices.factory import make_device
from outcore.runtime.executor import Executor

MODELS = {"resnet20-cifar": {}, "transformer": {"tie_weights": False}, "alexnet": {}}
POLICIES = ["outcore-auto", "outcore-checkpoint", "superneurons"]
_graphs: dict[str, tuple[object, object]] = {}


def _workload(name: str):
    if name not in _graphs:
        w = zoo.get(name, 4, small=True, **MODELS[name])
        graph = capture(copy.deepcopy(w.model), w.loss_fn, w.batch)
        measure_temporaries(graph, w.batch)  # the allocator's kernel scratch, on the ops
        _graphs[name] = (w, graph)
    return _graphs[name]


def _plan(graph, budget, **kw):
    return outcore.plan(graph, budget, gpu="this-cpu", host_budget=0, simulate=False, **kw)


def activation_bytes(graph, schedule) -> list[int]:
    """Per instruction, the real graph's device bytes (the memory rule's replay) less the
    resident storages of parameters, buffers, inputs and parameters' gradients, plus, at a
    Compute of the op that makes a parameter's gradient, its measured scratch beyond its
    temporaries (the kernel may build the gradient in scratch); written here from the
    definition, not with ``outcore.plan.scope``'s functions."""
    params = {t.source for t in graph.tensors
              if t.kind in (TensorKind.PARAMETER, TensorKind.INPUT) and t.source}
    left_out = {t.storage for t in graph.tensors
                if t.kind in (TensorKind.PARAMETER, TensorKind.BUFFER, TensorKind.INPUT)}
    left_out |= {graph.tensors[o].storage for o in graph.outputs
                 if graph.tensors[o].kind is TensorKind.GRADIENT
                 and graph.tensors[o].source.removeprefix("grad:") in params}
    scratch = graph.meta.get(SCRATCH)  # measured: what the op held and freed again
    made: dict[int, int] = {}  # op -> what the scope charges it beyond its temporaries
    for s in left_out:
        t = graph.tensors[s]
        if t.kind is TensorKind.GRADIENT and t.producer is not None:
            op = graph.ops[t.producer]
            made[op.id] = (max(0, scratch[op.id] - op.temporaries) if scratch
                           else made.get(op.id, 0) + t.nbytes)
    held, out = 0, []
    for step in residency_steps(graph, schedule):
        for a in step.allocations:
            if a.storage != TRANSIENT and a.storage in left_out:
                held += a.nbytes
        if step.released in left_out:
            held -= graph.tensors[step.released].nbytes
        if step.at >= 0:
            ins = schedule.instructions[step.at]
            scratch = made.get(ins.op, 0) if isinstance(ins, Compute) else 0
            out.append(step.device - held + scratch)
    return out


def _unbounded(graph) -> int:
    return _plan(graph, None, scope="activations").scoped_peak


def _between(graph) -> int:
    """An activation budget halfway between the lowest any plan reaches (the refusal's
    floor) and the unbounded plan's activation peak."""
    with pytest.raises(InfeasibleBudgetError) as info:
        _plan(graph, 1, scope="activations")
    lowest = max(info.value.required, info.value.lowest or 0)
    top = _unbounded(graph)
    assert lowest < top
    return (lowest + top) // 2


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", list(MODELS))
def test_activation_budget_bounds_every_instruction(name, policy):
    _, graph = _workload(name)
    budget = _between(graph)
    try:
        planned = _plan(graph, budget, policy=policy, scope="activations")
    except InfeasibleBudgetError as exc:
        assert policy != "outcore-auto", str(exc)
        assert "activations only" in str(exc)
        return
    acts = activation_bytes(graph, planned.schedule)
    assert max(acts) == planned.scoped_peak <= budget
    assert planned.scope == "activations" and planned.graph is graph
    assert planned.predicted_peak == memory_curve(graph, planned.schedule).peak
    assert planned.predicted_peak > budget  # the whole step is not what was bounded
    assert "activations only" in planned.explain().notes[0]
    if policy == "outcore-auto":
        assert planned.counts()["recompute"] > 0


@pytest.mark.parametrize("name", ["resnet20-cifar", "transformer"])
def test_step_scope_is_the_default_and_unchanged(name):
    _, graph = _workload(name)
    top = _plan(graph, None).predicted_peak
    budget = graph.static_bytes() + (top - graph.static_bytes()) * 8 // 10
    default = _plan(graph, budget)
    step = _plan(graph, budget, scope="step")
    assert default.schedule.instructions == step.schedule.instructions
    assert default.scope == step.scope == "step"
    assert default.scoped_peak == default.predicted_peak <= budget
    scoped = _plan(graph, budget, scope="activations")
    assert scoped.schedule.instructions != default.schedule.instructions


@pytest.mark.parametrize("name", ["resnet20-cifar", "transformer"])
def test_scoped_plan_gives_eagers_gradients_on_the_emulated_device(name):
    w, graph = _workload(name)
    planned = _plan(graph, _between(graph), scope="activations")
    assert planned.counts()["recompute"] > 0
    model = copy.deepcopy(w.model)
    torch.manual_seed(3)
    loss = w.loss_fn(model(w.batch[0]), w.batch[1])
    loss.backward()
    device = make_device("cpu-emulated", capacity=planned.predicted_peak, bandwidth=1e10)
    torch.manual_seed(3)
    result = Executor(planned.graph, planned.schedule, device).run(w.batch, apply=False)
    assert torch.equal(result.loss, loss.detach())
    for pname, p in model.named_parameters():
        assert torch.equal(result.grads[pname], p.grad), pname
    # the emulated device's tracker counts tensors, not the kernels' measured scratch
    assert result.peak_bytes == memory_curve(graph, planned.schedule, no_workspace).peak


def _lowest(graph) -> PlannedStep:
    """The activation-scoped plan at the lowest budget outcore-auto accepts (recompute
    only), found by climbing to what each refusal says it needs."""
    budget = 1
    for _ in range(8):
        try:
            return _plan(graph, budget, scope="activations")
        except InfeasibleBudgetError as exc:
            budget = max(budget + 1, exc.required)
    raise AssertionError("no activation budget found")


def test_on_a_resnet_the_scoped_plan_holds_less_activation_at_the_same_step_peak():
    _, graph = _workload("resnet20-cifar")
    scoped = _lowest(graph)
    whole = _plan(graph, scoped.predicted_peak)  # step scope, the same step peak allowed
    assert whole.predicted_peak <= scoped.predicted_peak
    assert max(activation_bytes(graph, whole.schedule)) > scoped.scoped_peak


def _measured_activation_peak(w, planned) -> int:
    """The CPU allocator's peak over one executor step of ``planned``, the parameters'
    gradients left out (as ``benchmarks/vs_pytorch.py --match activation`` measures)."""
    executor = Executor(planned.graph, planned.schedule)
    executor.run(w.batch, apply=False)  # warm up
    grads: list[torch.Tensor] = []

    def run():
        result = executor.run(w.batch, apply=False)
        grads[:] = result.grads.values()
        return result

    return allocator_peak(run, lambda: grads).peak


@pytest.mark.parametrize("name", ["transformer", "resnet20-cifar"])
def test_the_allocators_activation_peak_is_bounded_by_the_scoped_peak(name):
    """On the ResNet, the CPU's convolution backward builds the weight gradient in scratch
    and then allocates it: with the gradient left out and its bytes not kept on the op, the
    step measured 4,608 B above the scoped peak (resnet20-cifar small, unbounded, session
    15). Charging every such op its gradient's bytes instead bounded it but, on the quick
    ResNet-18 of ``benchmarks/vs_pytorch.py``, 9.4 MB too high (a 3x3 512-channel
    convolution that builds no scratch): the measured scratch keeps the bound within 5%
    (1.9% on resnet20-cifar at two intra-op threads, 3.7% at one, as ``make test``'s xdist
    workers run: 294,624 B measured against 305,856 scoped; not traced further)."""
    w, graph = _workload(name)
    for budget in (None, _between(graph)):
        planned = _plan(graph, budget, scope="activations")
        measured = _measured_activation_peak(w, planned)
        assert measured <= planned.scoped_peak, (budget, measured, planned.scoped_peak)
        assert measured >= 0.95 * planned.scoped_peak, (budget, measured, planned.scoped_peak)


def test_scoped_curve_is_the_real_curve_less_the_left_out_storages():
    _, graph = _workload("resnet20-cifar")
    planned = _plan(graph, _between(graph), scope="activations")
    assert scoped_curve(graph, planned.schedule).device == activation_bytes(graph,
                                                                           planned.schedule)


def test_what_an_activation_scope_refuses():
    _, graph = _workload("resnet20-cifar")
    with pytest.raises(InvalidArgumentError, match="scope"):
        _plan(graph, None, scope="weights")
    with pytest.raises(InvalidArgumentError, match="optimizer"):
        _plan(graph, "1GiB", scope="activations", optimizer="adamw")
    with pytest.raises(InvalidArgumentError, match="allow_sub_batches"):
        _plan(graph, "1GiB", scope="activations", allow_sub_batches=True)
    with pytest.raises(InfeasibleBudgetError, match="activations only") as info:
        _plan(graph, 1024, scope="activations")
    assert info.value.required < graph.static_bytes()  # in the scope's terms


def test_the_plan_cache_keys_on_the_scope(tmp_path, monkeypatch):
    monkeypatch.setenv("OUTCORE_CACHE_DIR", str(tmp_path))
    _, graph = _workload("resnet20-cifar")
    budget = _between(graph)
    first = _plan(graph, budget, scope="activations", cache=True)
    again = _plan(graph, budget, scope="activations", cache=True)
    assert again.schedule.instructions == first.schedule.instructions
    assert (again.scoped_peak, again.predicted_peak) == (first.scoped_peak,
                                                         first.predicted_peak)
    # the same bytes as a step budget: below the static tensors, refused, not served cached
    with pytest.raises(InfeasibleBudgetError):
        _plan(graph, budget, cache=True)


def test_the_cli_plans_an_activation_budget(capsys):
    import json

    from outcore.cli import EXIT_OK, EXIT_USAGE, main

    args = ["plan", "--model", "resnet20-cifar", "--batch", "8", "--budget", "1GB",
            "--no-cache"]
    assert main(["--json", *args, "--scope", "activations"]) == EXIT_OK
    scoped = json.loads(capsys.readouterr().out)
    assert scoped["scope"] == "activations"
    assert 0 < scoped["scoped_peak"] < scoped["predicted_peak"]
    assert scoped["predicted_peak"] - scoped["scoped_peak"] >= scoped["simulation"][
        "static_bytes"] - 4  # parameters and inputs left out (the loss seed stays in)
    assert main([*args, "--scope", "weights"]) == EXIT_USAGE


def test_the_inductor_backend_checks_its_scope_at_once():
    with pytest.raises(InvalidArgumentError, match="scope"):
        outcore.inductor_backend("64KiB", scope="all")
    assert outcore.inductor_backend("64KiB", scope="activations") is not None
