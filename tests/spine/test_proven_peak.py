"""Steps counted once: on a real device (the plain CPU, CUDA) the executor runs a step on
batch shapes whose counted step fitted the capacity without the memory tracker, and reports
that proven peak; on the emulated device, or with ``measure_every_step``, every step is
counted; a capacity lowered under the proven peak is counted (and enforced) again."""

import copy

import pytest
import torch

import outcore
from outcore.capture import capture
from outcore.errors import DeviceOutOfMemory, OutcoreError
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.policies import baseline
from outcore.runtime.devices import SyncCPUDevice, make_device
from outcore.runtime.executor import Executor, batch_key

from models import make

STEPS = 3


def _eager_grads(model, loss_fn, batch, steps):
    reference = copy.deepcopy(model)
    for seed in range(steps):
        torch.manual_seed(seed)  # dropout draws as the planned step's (seeded alike)
        loss_fn(reference(batch[0]), batch[1]).backward()
    return {n: p.grad for n, p in reference.named_parameters()}


def _seeded(run, steps):
    results = []
    for seed in range(steps):
        torch.manual_seed(seed)
        results.append(run())
    return results


def _executor(name, device_for):
    model, loss_fn, batch = make(name)
    graph = capture(model, loss_fn, batch)
    schedule = lower(graph, baseline.offload_all(graph))
    peak = predicted_peak(graph, schedule)
    return model, loss_fn, batch, Executor(graph, schedule, device_for(peak)), peak


@pytest.mark.parametrize("name", ["mlp", "resnet", "transformer"])
def test_later_steps_skip_the_tracker_with_the_same_grads_and_peak(name):
    model, loss_fn, batch, executor, peak = _executor(name, SyncCPUDevice)
    expected = _eager_grads(model, loss_fn, batch, STEPS)
    results = _seeded(lambda: executor.run(batch), STEPS)
    assert [r.peak_measured for r in results] == [True] + [False] * (STEPS - 1)
    assert [r.peak_bytes for r in results] == [peak] * STEPS
    assert executor.device.tracker.allocations == 0, "the last step ran under the tracker"
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, expected[n]), n


def test_a_capacity_lowered_under_the_proven_peak_is_enforced_again():
    model, _, batch, executor, peak = _executor("mlp", SyncCPUDevice)
    executor.run(batch)
    before = {n: p.grad.clone() for n, p in model.named_parameters()}
    executor.capacity = peak - 1
    assert all(executor.needs_measuring(key) for key in executor.proven)
    with pytest.raises(DeviceOutOfMemory):
        executor.run(batch)
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, before[n]), f"{n}: a failed step applied its gradient"
    executor.capacity = peak  # the first step's proof holds again
    again = executor.run(batch)
    assert not again.peak_measured and again.peak_bytes == peak


def test_the_emulated_device_counts_every_step():
    def emulated(peak):
        return make_device("cpu-emulated", capacity=peak, bandwidth=1e12)

    _, _, batch, executor, peak = _executor("mlp", emulated)
    try:
        results = [executor.run(batch) for _ in range(STEPS)]
    finally:
        executor.device.close()
    assert all(r.peak_measured and r.peak_bytes == peak for r in results)


def test_measure_every_step_counts_every_step():
    _, _, batch, executor, peak = _executor("mlp", SyncCPUDevice)
    executor.measure_every_step = True
    results = [executor.run(batch) for _ in range(STEPS)]
    assert all(r.peak_measured and r.peak_bytes == peak for r in results)
    assert executor.device.tracker.allocations > 0


def test_measure_false_under_a_capacity_needs_a_counted_step_first():
    _, _, batch, executor, peak = _executor("mlp", SyncCPUDevice)
    with pytest.raises(OutcoreError, match="count one step"):
        executor.run(batch, measure=False)
    executor.run(batch, measure=True)
    unmeasured = executor.run(batch, measure=False)
    assert not unmeasured.peak_measured and unmeasured.peak_bytes == peak


def test_batch_key_tells_apart_shapes_strides_and_dtypes():
    x = torch.randn(2, 3, 4, 4)
    channels_last = x.to(memory_format=torch.channels_last)
    keys = {batch_key([x]), batch_key([x[:1]]), batch_key([channels_last]),
            batch_key([x.double()])}
    assert len(keys) == 4
    assert batch_key([x.clone()]) == batch_key([x])


def test_the_trainer_on_cpu_counts_the_first_step_and_keeps_its_peak():
    model, loss_fn, batch = make("resnet")
    expected = _eager_grads(model, loss_fn, batch, STEPS)
    trainer = outcore.compile(model, loss_fn, batch, budget=None, device="cpu")
    peaks = []
    for seed in range(STEPS):
        torch.manual_seed(seed)
        trainer.step(*batch)
        peaks.append(trainer.stats.tensor_peak)
    assert peaks == [peaks[0]] * STEPS and peaks[0] > 0
    assert trainer.executor.device.tracker.allocations == 0
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, expected[n]), n


def test_replaced_kernels_are_counted_again():
    _, _, batch, executor, _ = _executor("mlp", SyncCPUDevice)
    executor.run(batch)
    assert not executor.run(batch).peak_measured
    executor.replace_ops({0: executor.kernel(0)})
    assert executor.run(batch).peak_measured, "another kernel may allocate otherwise"


def _at_capacity_of_first_step(executor, batch):
    executor.run(batch)
    executor.capacity = executor.proven[next(iter(executor.proven))]


def test_a_batch_sliced_from_a_larger_tensor_is_counted_again():
    # the tracker counts the batch's whole storage: a slice of a larger tensor holds more
    _, _, batch, executor, _ = _executor("mlp", SyncCPUDevice)
    _at_capacity_of_first_step(executor, batch)
    x, y = batch
    larger = torch.cat([x, torch.randn(64 * x.shape[0], *x.shape[1:])])
    with pytest.raises(DeviceOutOfMemory):
        executor.run((larger[: x.shape[0]], y))


def test_parameters_made_views_of_one_vector_are_counted_again():
    model, _, batch, executor, _ = _executor("mlp", SyncCPUDevice)
    _at_capacity_of_first_step(executor, batch)
    params = list(model.parameters())
    population = torch.randn(4, sum(p.numel() for p in params))
    torch.nn.utils.vector_to_parameters(population[0], params)  # each a view of one row
    with pytest.raises(DeviceOutOfMemory):
        executor.run(batch)


def test_a_batch_whose_tensors_stop_sharing_a_storage_is_counted_again():
    # a denoising autoencoder stepped on (x, x), then on (x + noise, x): one tensor more
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 64))
    x = torch.randn(32, 64)
    trainer = outcore.compile(model, torch.nn.functional.mse_loss, (x, x), budget=None,
                              device="cpu")
    trainer.step(x, x)
    trainer.executor.capacity = trainer.stats.tensor_peak
    trainer.step(x, x)
    with pytest.raises(DeviceOutOfMemory):
        trainer.step(x + 0.1 * torch.randn_like(x), x)


def test_measure_every_step_on_the_class_reaches_every_executor(monkeypatch):
    monkeypatch.setattr(Executor, "measure_every_step", True)
    _, _, batch, executor, _ = _executor("mlp", SyncCPUDevice)
    assert all(executor.run(batch).peak_measured for _ in range(STEPS))


def test_sub_batched_steps_say_whether_every_part_was_counted():
    from outcore.runtime.subbatch import run_sub_batches

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    graph = capture(model, torch.nn.functional.cross_entropy, (x[:4], y[:4]))
    executor = Executor(graph, lower(graph, baseline.offload_all(graph)), SyncCPUDevice())
    proved = run_sub_batches(executor, (x, y), 2)  # the second part: the first's twin
    assert not proved.peak_measured and len(executor.proven) == 1
    executor.measure_every_step = True
    counted = run_sub_batches(executor, (x, y), 2)
    assert counted.peak_measured
    assert counted.peak_bytes == proved.peak_bytes > 0
