"""Races on a GPU: copies slowed on purpose (the copy streams spin before each copy) change
no result; a schedule missing its prefetch Waits reads poison; one missing its offload
Waits is still safe on CUDA (``record_stream`` holds the source), unlike the emulated device.
"""

from __future__ import annotations

import pytest
import torch

from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.plan.schedule import Schedule, Wait
from outcore.policies import baseline
from outcore.runtime.devices.cuda import CudaDevice
from outcore.runtime.executor import Executor

from cuda_helpers import SEED, CudaWork, cuda_work, grads_equal

#: GPU clock cycles each copy stream spins before each copy (~10 ms at 1.7 GHz): far longer
#: than the kernels of these small networks, so every consumer reaches its Wait first.
SLOW = 17_000_000


def without_waits(schedule: Schedule, direction: str) -> Schedule:
    kept = [i for i in schedule.instructions
            if not (isinstance(i, Wait) and i.direction == direction)]
    return Schedule(kept, keep_at_end=schedule.keep_at_end, policy=f"broken: no {direction}")


def run(work: CudaWork, schedule: Schedule, **device_options) -> tuple:
    work.reset()
    with CudaDevice(**device_options) as device:
        torch.manual_seed(SEED)
        result = Executor(work.graph, schedule, device, check=False).run(work.batch)
        return result, device.stats()


@pytest.mark.parametrize("name", ["vgg11", "resnet18", "transformer"])
def test_slowed_copies_change_nothing_and_stall_compute(name: str) -> None:
    """How much copy time hides behind compute is speed (benchmarks/cuda_speed.py reports
    it); on these small networks the kernels are microseconds, so it may be none at all."""
    work = cuda_work(name)
    schedule = lower(work.graph, baseline.offload_all(work.graph))
    for delay in (0, SLOW):
        result, stats = run(work, schedule, copy_delay_cycles=delay, poison=True)
        assert torch.equal(result.loss, work.loss), f"{name} delay {delay}"
        assert grads_equal(work) == [], f"{name} delay {delay}"
        assert result.peak_bytes == predicted_peak(work.graph, schedule)
        assert stats.d2h.copies == stats.h2d.copies > 0
        if delay:  # the compute stream really stood still for the slowed copies
            assert stats.exposed_s > 0.001


def test_a_missing_prefetch_wait_reads_poison() -> None:
    work = cuda_work("vgg11")
    schedule = without_waits(lower(work.graph, baseline.offload_all(work.graph)), "h2d")
    result, _ = run(work, schedule, copy_delay_cycles=SLOW, poison=True)
    assert not torch.equal(result.loss, work.loss) or grads_equal(work), \
        "reading a prefetched tensor before its copy must not pass unnoticed"


def test_a_missing_offload_wait_is_safe_on_cuda() -> None:
    """record_stream keeps the source block from reuse until the D2H copy ran."""
    work = cuda_work("vgg11")
    schedule = without_waits(lower(work.graph, baseline.offload_all(work.graph)), "d2h")
    result, _ = run(work, schedule, copy_delay_cycles=SLOW)
    assert torch.equal(result.loss, work.loss)
    assert grads_equal(work) == []
