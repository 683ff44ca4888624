"""Oracle + prediction: gradients, loss and BatchNorm buffers equal eager PyTorch bit for bit,
and the measured peak equals the Schedule's predicted peak to the byte."""

import copy

import pytest
import torch

from outcore.capture import capture
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.plan.verify import verify
from outcore.policies import baseline
from outcore.runtime.executor import Executor

from models import MODELS, make

POLICIES = [baseline.keep_all, baseline.liveness, baseline.offload_all, baseline.recompute_cheap]


def eager_step(model, loss_fn, batch, seed):
    torch.manual_seed(seed)
    loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("name", MODELS)
def test_policies_match_eager_and_predicted_peak(name):
    model, loss_fn, batch = make(name)
    reference = copy.deepcopy(model)
    expected_loss = eager_step(reference, loss_fn, batch, seed=7)
    peaks = {}
    for policy in POLICIES:
        trained = copy.deepcopy(model)
        graph = capture(trained, loss_fn, batch)
        schedule = lower(graph, policy(graph))
        verify(graph, schedule)
        torch.manual_seed(7)
        result = Executor(graph, schedule).run(batch)
        label = f"{name}/{policy.__name__}"
        assert torch.equal(result.loss, expected_loss), label
        for (pname, p), q in zip(trained.named_parameters(), reference.parameters(), strict=True):
            assert p.grad is not None and torch.equal(p.grad, q.grad), f"{label}: grad {pname}"
        for (bname, b), c in zip(trained.named_buffers(), reference.buffers(), strict=True):
            assert torch.equal(b, c), f"{label}: buffer {bname} (updated once, like eager)"
        assert result.peak_bytes == predicted_peak(graph, schedule), label
        peaks[policy.__name__] = result.peak_bytes
    assert peaks["keep_all"] > peaks["liveness"], "freeing at last use must lower the peak"
    assert peaks["offload_all"] <= peaks["liveness"]


def test_second_step_accumulates_like_eager():
    model, loss_fn, batch = make("resnet")
    reference = copy.deepcopy(model)
    graph = capture(model, loss_fn, batch)
    executor = Executor(graph, lower(graph, baseline.offload_all(graph)))
    for seed in (1, 2):
        eager_step(reference, loss_fn, batch, seed)
        torch.manual_seed(seed)
        executor.run(batch)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    for b, c in zip(model.buffers(), reference.buffers(), strict=True):
        assert torch.equal(b, c)


def test_unmeasured_run_gives_the_same_gradients_and_refuses_a_capacity():
    from outcore.errors import OutcoreError
    from outcore.runtime.devices import SyncCPUDevice

    model, loss_fn, batch = make("resnet")
    reference = copy.deepcopy(model)
    eager_step(reference, loss_fn, batch, seed=2)
    graph = capture(model, loss_fn, batch)
    schedule = lower(graph, baseline.offload_all(graph))
    torch.manual_seed(2)
    result = Executor(graph, schedule).run(batch, measure=False)
    assert result.peak_bytes == 0
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    bounded = Executor(graph, schedule, SyncCPUDevice(capacity=10**9))
    with pytest.raises(OutcoreError, match="capacity"):
        bounded.run(batch, measure=False)
