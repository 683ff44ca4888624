"""The correctness oracle over the whole model zoo (small versions): loss and gradients equal
eager PyTorch bit for bit under keep, offload and recompute, and the measured peak equals the
prediction."""

import copy

import pytest
import torch

from outcore import zoo
from outcore.capture import capture
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.policies import baseline
from outcore.runtime.executor import Executor

POLICIES = [baseline.liveness, baseline.offload_all, baseline.recompute_cheap]


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_matches_eager(name):
    work = zoo.get(name, 2, small=True)
    reference = copy.deepcopy(work.model)
    torch.manual_seed(3)
    expected = work.loss_fn(reference(work.batch[0]), work.batch[1])
    expected.backward()
    graph = capture(work.model, work.loss_fn, work.batch)
    for policy in POLICIES:
        for p in work.model.parameters():
            p.grad = None
        state = copy.deepcopy(work.model.state_dict())
        schedule = lower(graph, policy(graph))
        torch.manual_seed(3)
        result = Executor(graph, schedule).run(work.batch)
        label = f"{name}/{policy.__name__}"
        assert torch.equal(result.loss, expected.detach()), label
        named = work.model.named_parameters()
        for (pname, p), q in zip(named, reference.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), f"{label}: {pname}"
        assert result.peak_bytes == predicted_peak(graph, schedule), label
        work.model.load_state_dict(state)  # running statistics: one update per compared step
