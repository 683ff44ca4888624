"""The executor on the CPU-emulated device: overlap can race, results must not change."""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
from outcore.capture import capture
from outcore.errors import DeviceOutOfMemory
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.plan.schedule import Schedule, Wait
from outcore.policies import baseline
from outcore.runtime.devices import EmulatedDevice
from outcore.runtime.executor import Executor

from models import make

FAST = 2e9  # bytes/s: copies of these small models finish in microseconds


def eager(model, loss_fn, batch, seed=11):
    torch.manual_seed(seed)
    loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach()


def run_on(device, name, schedule_fn=None, seed=11):
    model, loss_fn, batch = make(name)
    graph = capture(model, loss_fn, batch)
    schedule = lower(graph, baseline.offload_all(graph))
    if schedule_fn is not None:
        schedule = schedule_fn(schedule)
    torch.manual_seed(seed)
    result = Executor(graph, schedule, device, check=schedule_fn is None).run(batch)
    return model, result, graph, schedule


@pytest.mark.parametrize("name", ["vgg", "resnet", "transformer"])
def test_slowed_copy_engine_changes_nothing(name):
    reference, _, batch = make(name)
    loss = eager(reference, make(name)[1], batch)
    for slowdown in (1.0, 100.0):
        with EmulatedDevice(None, FAST, FAST, slowdown=slowdown) as dev:
            model, result, graph, schedule = run_on(dev, name)
            stats = dev.stats()
        assert torch.equal(result.loss, loss)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), f"{name} slowdown {slowdown}"
        assert result.peak_bytes == predicted_peak(graph, schedule)
        assert stats.releases_during_copy == 0
        assert stats.d2h.bytes == stats.h2d.bytes > 0


def drop_d2h_waits(schedule: Schedule) -> Schedule:
    kept = [i for i in schedule.instructions if not (isinstance(i, Wait) and i.direction == "d2h")]
    return Schedule(kept, keep_at_end=schedule.keep_at_end, policy="broken: no d2h waits")


def test_free_without_waiting_for_its_copy_is_caught():
    """Break the wait on purpose: the freed memory is reused while the copy reads it."""
    reference, loss_fn, batch = make("vgg")
    eager(reference, loss_fn, batch)
    with EmulatedDevice(None, FAST, FAST, slowdown=100.0) as dev:
        model, _, _, _ = run_on(dev, "vgg", drop_d2h_waits)
        releases = dev.stats().releases_during_copy
    assert releases > 0
    same = all(torch.equal(p.grad, q.grad)
               for p, q in zip(model.parameters(), reference.parameters(), strict=True))
    assert not same, "a free that does not wait for its copy must corrupt the result"


def test_capacity_overflow_raises_and_leaves_model_untouched():
    model, loss_fn, batch = make("resnet")
    graph = capture(model, loss_fn, batch)
    schedule = lower(graph, baseline.liveness(graph))
    peak = predicted_peak(graph, schedule)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # one good step so the optimizer has state, then a step that cannot fit
    Executor(graph, schedule).run(batch)
    optimizer.step()
    before = copy.deepcopy(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    opt_state = copy.deepcopy(optimizer.state_dict())
    with EmulatedDevice(peak - 1, FAST, FAST) as dev, pytest.raises(DeviceOutOfMemory) as err:
        Executor(graph, schedule, dev).run(batch)
    message = str(err.value)
    assert "wanted" in message and "free" in message and err.value.tensor != "<unnamed>"
    assert err.value.wanted > err.value.free
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert str(opt_state) == str(optimizer.state_dict())


def test_capacity_equal_to_predicted_peak_fits_exactly():
    model, loss_fn, batch = make("densenet")
    graph = capture(model, loss_fn, batch)
    schedule = lower(graph, baseline.offload_all(graph))
    peak = predicted_peak(graph, schedule)
    with EmulatedDevice(peak, FAST, FAST) as dev:
        result = Executor(graph, schedule, dev).run(batch)
    assert result.peak_bytes == peak
