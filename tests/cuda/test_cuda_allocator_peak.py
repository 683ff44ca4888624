"""CUDA's caching allocator never holds more than outcore predicts (issue 23, point 2, on a GPU).

For every zoo network (the very deep ones aside: ``DEEP``, whose planning alone takes minutes
of the CPU) under every registered policy, at three quarters of the in-core peak:
the graph captured on the GPU, each op's kernel temporaries measured with CUDA's allocator
counters (``measure_temporaries(..., device="cuda")``: cuDNN/cuBLAS workspaces, reduction
buffers), the plan lowered and run by the executor on ``CudaDevice``, and
``torch.cuda.max_memory_allocated`` over the step (``cuda_allocator_peak``, after a warm-up
step) compared with the bound the plan predicts:

    allocator peak  <=  cuda_peak_bound(graph, schedule)

``cuda_peak_bound`` is ``caching_allocator_bound`` (the memory rule's replay, temporaries held
during each Compute, every storage and transient the step allocates counted as the largest
block the caching allocator can hand out for it: 512-byte rounding, and a large block left
unsplit unless ``expandable_segments`` is on) less the bytes allocated when the step starts
(``held_before``). Host copies are pinned host memory, outside CUDA's allocator: they are not
in the bound and not in the measurement. The first run on an H200 with the 512-byte rounding
alone failed on ``fcn`` (keep-all 660,562 B over): unsplit large blocks, now in the bound.
"""

from __future__ import annotations

import pytest
import torch

from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.cost.measure_temporaries import measure_temporaries
from outcore.errors import InfeasibleBudgetError, OutcoreError
from outcore.graph.ir import Graph
from outcore.hardware import detect_cuda_profile
from outcore.plan.allocator_rounding import caching_allocator_bound
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Plan
from outcore.policies import registry
from outcore.policies.registry import PolicyContext
from outcore.runtime.devices.allocator_peak import cuda_allocator_peak, held_before
from outcore.runtime.devices.cuda import CudaDevice
from outcore.runtime.executor import Executor

from cuda_helpers import SEED, to_cuda

OPTIONS = {"transformer": {"tie_weights": False}}
#: left out of the GPU run: minutes of planning each (the CPU twin,
#: tests/devices/test_allocator_peak.py, runs them as a slow test)
DEEP = {"vgg101", "vgg116", "vgg216", "vgg316", "vgg416", "vgg-deep", "resnet-units",
        "resnet101", "resnet152", "resnet110-cifar", "llama-7b"}
_graphs: dict[str, tuple[object, Graph]] = {}


def cuda_peak_bound(graph: Graph, schedule) -> int:
    """What CUDA's allocator may hold at most during a step of ``schedule`` beyond what was
    allocated before it (module docstring)."""
    return caching_allocator_bound(graph, schedule) - held_before(graph)


def _measured(name: str) -> tuple[object, Graph]:
    if name not in _graphs:
        w = zoo.get(name, 4, small=True, **OPTIONS.get(name, {}))
        w.model.cuda()
        batch = to_cuda(tuple(w.batch))
        graph = capture(w.model, w.loss_fn, batch)
        measure_temporaries(graph, batch, device="cuda")
        _graphs[name] = ((w, batch), graph)
    return _graphs[name]


def check_cuda_allocator_within_prediction(name: str, policy: str) -> None:
    (_work, batch), graph = _measured(name)
    in_core = memory_curve(graph, lower(graph, Plan("in-core")))
    budget = in_core.static + (in_core.peak - in_core.static) * 3 // 4
    cost = cost_model_for(detect_cuda_profile() or "h100")
    try:
        out = registry.get(policy).fn(graph, PolicyContext(budget=budget, cost=cost))
    except InfeasibleBudgetError as exc:  # the policy cannot reach this budget
        assert exc.required > budget
        return
    except OutcoreError as exc:  # the policy does not take this model: nothing to run
        pytest.skip(f"{policy} on {name}: {exc}")
    with CudaDevice() as device:
        executor = Executor(out.graph, out.schedule, device)
        torch.manual_seed(SEED)
        executor.run(batch, apply=False)  # warm-up: cuBLAS/cuDNN handles, lazy inits
        torch.manual_seed(SEED)
        measured = cuda_allocator_peak(lambda: executor.run(batch, apply=False)).peak
    bound = cuda_peak_bound(out.graph, out.schedule)
    assert measured <= bound, (
        f"{name} under {policy}: CUDA's allocator held {measured} B over the step, "
        f"{measured - bound} B above the predicted bound {bound} B")


@pytest.mark.parametrize("policy", registry.names())
@pytest.mark.parametrize("name", [n for n in zoo.names() if n not in DEEP])
def test_cuda_allocator_peak_never_exceeds_the_prediction(name, policy):
    check_cuda_allocator_within_prediction(name, policy)
