"""Mixed precision (``MasterWeights``) planned as it runs: the fp32 masters and their optimizer
state are host bytes, never device bytes, and their casts are priced.

``MasterWeights`` keeps every master on the CPU and the optimizer is built on the masters, so
their state is there too; the device holds the bf16 parameters and what the step makes.
Before, the plan counted each device-held parameter's master and state in ``device_state``:
with AdamW the device needed 12 bytes per element (plus a 4-byte step per parameter) more
than it held (a budget that fits the step was refused), and the host bytes left the
device-held parameters' masters out. The step each mixed-precision parameter takes moves
two casts more on the host (the bf16 gradient widened into the master, the master cast
into the parameter), which were never priced.
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_finetune import batches, weight_bytes
from weights_helpers import make_gpt, token_loss

import outcore
from outcore.cost.profiles import get_profile
from outcore.plan.memory import memory_curve
from outcore.plan.weights import gradients, parameters
from outcore.weights import compile as compile_weights
from outcore.weights.mixed import MasterWeights
from outcore.weights.report import build_report
from outcore.weights.spec import graph_masters, torch_spec
from outcore.weights.step_cost import (
    host_bandwidth,
    host_steps,
    master_cast_seconds,
    step_seconds,
)

FAST = 2e9


def bf16_gpt():
    model, example = make_gpt()
    return model.to(torch.bfloat16), example


def compiled(budget, weights, *, master=True, profile=None):
    """(model, its MasterWeights or None, the AdamW, a WeightTrainer at ``budget``)."""
    model, example = bf16_gpt()
    masters = MasterWeights(model) if master else None
    opt = torch.optim.AdamW(masters.parameters() if masters else model.parameters(),
                            lr=1e-3)
    trainer = compile_weights(model, token_loss, example, optimizer=opt, budget=budget,
                              bandwidth=FAST, master=masters, weights=weights,
                              profile=profile)
    return model, masters, opt, trainer


def host_allocated(masters, opt):
    """Bytes of every master and of the optimizer state torch keeps for them."""
    state = sum(v.nbytes for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    return sum(m.nbytes for m in masters.masters.values()) + state


def test_the_device_budget_of_a_mixed_precision_step_is_its_measured_peak():
    """Every parameter on the device: the plan's device bytes (peak + state) are what the
    device measures, and a budget of exactly that is enough. The host bytes are every
    master and its AdamW state, what MasterWeights and torch allocate."""
    *_, probe = compiled(10**9, "device")
    with probe:
        need = probe.predicted_peak
    _, masters, opt, trainer = compiled(need, "device")  # before: refused (state on device)
    with trainer:
        assert trainer.choice.device_state == 0
        assert not trainer.held()
        for x, y in batches(2):
            trainer.train_step(x, y)
            assert trainer.measured_peak == trainer.predicted_peak + trainer.choice.device_state
        assert trainer.measured_peak == need
        assert all(m.device.type == "cpu" for m in masters.masters.values())
        assert trainer.choice.host_state == host_allocated(masters, opt)
        assert trainer.choice.host_resident == host_allocated(masters, opt)


def test_held_and_device_kept_parameters_are_both_counted_on_the_host():
    """A budget below the bf16 weights: some parameters held. The device still holds no
    optimizer bytes; the host holds the held bf16 weights, every master and all the state."""
    model, masters, opt, trainer = compiled(weight_bytes(bf16_gpt()[0]), "auto")
    with trainer:
        held = trainer.held()
        assert 0 < len(held) < len(masters.masters)
        for x, y in batches(2):
            trainer.train_step(x, y)
        assert trainer.choice.device_state == 0
        assert trainer.measured_peak == trainer.predicted_peak
        named = dict(model.named_parameters())
        assert trainer.choice.host_state == host_allocated(masters, opt)
        assert trainer.choice.host_resident == (sum(named[n].nbytes for n in held)
                                                + host_allocated(masters, opt))
        report = build_report(trainer.graph, trainer.choice, "adamw", "auto",
                              memory_curve(trainer.graph, trainer.choice.schedule).host)
        assert report.host_bytes == report.host_copies + host_allocated(masters, opt)


def test_a_named_spec_plans_the_masters_where_compile_puts_them():
    """``outcore.plan(graph, optimizer="adamw")`` on a bf16 graph is the MasterWeights
    recipe: the same device and host bytes as ``compile(..., master=)``."""
    model, example = bf16_gpt()
    graph = outcore.capture(model, token_loss, example)
    assert graph_masters(graph, "adamw") == set(parameters(graph))
    assert graph_masters(graph, torch_spec("AdamW", master=False)) == frozenset()
    planned = outcore.plan(graph, 10**9, optimizer="adamw", weights="device",
                           gpu="a100-40gb", cache=False)
    *_, trainer = compiled(10**9, "device")
    with trainer:
        assert planned.weights.device_state == trainer.choice.device_state == 0
        assert planned.weights.host_state == trainer.choice.host_state
        assert planned.predicted_peak == trainer.predicted_peak


def test_step_seconds_price_both_casts():
    """Per element: the bf16 gradient widened (2 read, 4 written) and the master cast into
    the parameter (4 read, 2 written): 12 bytes at the host's DRAM bandwidth."""
    a100 = get_profile("a100-40gb")
    plain = step_seconds({"host": 10**8}, a100)[1]
    cast = step_seconds({"host": 10**8}, a100, master_cast_bytes=2)[1]
    assert cast - plain == pytest.approx(10**8 * 12 / host_bandwidth(a100))
    assert master_cast_seconds(10**8, 2, host_bandwidth(a100)) == pytest.approx(cast - plain)
    assert master_cast_seconds(10**8, 0, 1.0) == 0.0


def test_a_mixed_precision_step_costs_the_casts_more():
    """The same placement (every parameter held) with and without masters: the pass is the
    same, the optimizer step is the priced casts of every element longer."""
    a100 = get_profile("a100-40gb")
    *_, mixed = compiled(10**9, "host", profile=a100)
    *_, plain = compiled(10**9, "host", master=False, profile=a100)
    with mixed, plain:
        assert mixed.held() == plain.held() and mixed.held()
        assert mixed.choice.step_seconds == plain.choice.step_seconds
        numel = sum(p.numel() for p in mixed.model.parameters())
        casts = master_cast_seconds(numel, 2, host_bandwidth(a100))
        assert casts > 0
        assert mixed.choice.optimizer_seconds - plain.choice.optimizer_seconds == \
            pytest.approx(casts, rel=1e-9)
        assert mixed.choice.total_seconds > plain.choice.total_seconds


def test_host_steps_step_every_mastered_parameter_on_the_host():
    """Overlapped pricing (the simulator's host timeline): with masters every parameter is
    stepped on the host with its casts; a device-kept one's updated weight goes back h2d."""
    model, example = bf16_gpt()
    graph = outcore.capture(model, token_loss, example)
    planned = outcore.plan(graph, 10**9, optimizer="adamw", weights="device",
                           gpu="a100-40gb", cache=False)
    a100 = get_profile("a100-40gb")
    names = set(parameters(graph))
    plain = host_steps(graph, planned.schedule, a100)
    mixed = host_steps(graph, planned.schedule, a100, masters=names)
    assert not plain.host and plain.device_seconds > 0
    assert mixed.device_seconds == 0
    params, grads = parameters(graph), gradients(graph)
    assert set(mixed.host) == set(grads.values())
    for name, g in grads.items():
        t = graph.tensors[params[name]]
        numel = t.nbytes // 2
        assert mixed.host[g] == pytest.approx(step_seconds({"host": numel}, a100)[1]
                                              + master_cast_seconds(numel, 2,
                                                                    host_bandwidth(a100)))
        assert mixed.h2d[g] == t.nbytes
