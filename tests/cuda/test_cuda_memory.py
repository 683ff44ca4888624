"""Memory on a GPU: tracked peak == predicted peak exactly; what the caching allocator adds
is bounded as docs/cuda.md states; out-of-memory is DeviceOutOfMemory naming the tensor.

The bound (docs/cuda.md, "Tracked bytes and the caching allocator"): during a step,
``torch.cuda.max_memory_allocated() - memory_allocated() before the step`` (A) and the
tracker's peak minus the step's static bytes (T) satisfy

    T  <=  A  <=  T + 511 x (storages live at the peak) + W

where 511 is the allocator's rounding of each block up to a multiple of 512 bytes and W is
the largest temporary an op allocates inside its kernel call (cuDNN/cuBLAS workspaces,
reduction buffers), which no dispatch mode sees; W is measured per op on the eager step.
"""

from __future__ import annotations

import pytest
import torch

from outcore.errors import DeviceOutOfMemory
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.policies import baseline
from outcore.runtime.devices.cuda import CudaDevice
from outcore.runtime.executor import Executor

from cuda_helpers import SEED, OpTemporaries, cuda_work

ROUND = 512


def _workspace(work) -> int:
    """W: the largest in-kernel temporary of the eager step's ops (see module doc)."""
    work.reset()
    probe = OpTemporaries()
    torch.manual_seed(SEED)
    with probe:
        loss = work.loss_fn(work.model(work.batch[0]), work.batch[1])
        loss.backward()
    work.reset()
    return probe.worst


@pytest.mark.parametrize("name", ["resnet18", "vgg11", "transformer"])
@pytest.mark.parametrize("policy", [baseline.liveness, baseline.offload_all,
                                    baseline.recompute_cheap], ids=lambda p: p.__name__)
def test_tracked_peak_is_predicted_and_allocator_overhead_is_bounded(name, policy) -> None:
    work = cuda_work(name)
    schedule = lower(work.graph, policy(work.graph))
    trace = memory_curve(work.graph, schedule)
    workspace = _workspace(work)
    with CudaDevice() as device:
        executor = Executor(work.graph, schedule, device)
        torch.manual_seed(SEED)
        executor.run(work.batch, apply=False)  # warm-up: cuBLAS/cuDNN handles and workspaces
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(SEED)
        result = executor.run(work.batch, apply=False)
        torch.cuda.synchronize()
        allocated = torch.cuda.max_memory_allocated() - before
    assert result.peak_bytes == trace.peak, "tracked bytes must equal the prediction"
    tracked = trace.peak - trace.static
    live = max(trace.live_tensors)
    assert tracked <= allocated, (tracked, allocated)
    assert allocated <= tracked + (ROUND - 1) * live + workspace, (
        f"{name}: allocator added {allocated - tracked} B over {tracked} B tracked; bound "
        f"{(ROUND - 1) * live} (rounding, {live} storages) + {workspace} (op temporaries)")


def test_capacity_overflow_is_device_out_of_memory_naming_the_tensor() -> None:
    work = cuda_work("resnet18")
    schedule = lower(work.graph, baseline.liveness(work.graph))
    peak = memory_curve(work.graph, schedule).peak
    work.reset()
    with CudaDevice(capacity=peak - 1) as device, pytest.raises(DeviceOutOfMemory) as err:
        Executor(work.graph, schedule, device).run(work.batch)
    assert err.value.tensor not in ("", "<unnamed>") and err.value.wanted > err.value.free
    assert all(p.grad is None for p in work.model.parameters()), "a failed step applies nothing"


def test_a_real_cuda_oom_in_a_prefetch_names_the_tensor() -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    with CudaDevice() as device:
        device.start_offload(5, x, name="big")
        device.wait_offload(5)
        device.synchronize()
        del x
        torch.cuda.empty_cache()
        allowed = torch.cuda.memory_reserved() + (64 << 20)
        torch.cuda.set_per_process_memory_fraction(allowed / total)
        try:
            with pytest.raises(DeviceOutOfMemory, match="'big'") as err:
                device.start_prefetch(5, "big")
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        assert err.value.wanted == 256 << 20
