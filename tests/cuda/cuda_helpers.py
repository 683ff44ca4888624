"""Helpers of the CUDA suite: zoo workloads on the GPU, eager references, device runs."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import outcore.api
from outcore import zoo
from outcore.capture import capture
from outcore.graph.ir import Graph
from outcore.runtime.devices.cuda import CudaDevice
from outcore.runtime.executor import Executor, StepResult

SEED = 7


def to_cuda(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cuda()
    if isinstance(value, (tuple, list)):
        return type(value)(to_cuda(v) for v in value)
    return value


@dataclass
class CudaWork:
    """A zoo network and batch on the GPU, its eager loss and gradients, and its graph."""

    name: str
    model: torch.nn.Module
    loss_fn: Any
    batch: tuple[Any, Any]
    loss: torch.Tensor
    grads: list[torch.Tensor]
    state: dict[str, torch.Tensor]
    graph: Graph

    def reset(self) -> None:
        """Back to the state before the eager step: parameters, buffers, no gradients."""
        self.model.load_state_dict(self.state)
        for p in self.model.parameters():
            p.grad = None


def cuda_work(name: str, batch_size: int = 2) -> CudaWork:
    work = zoo.get(name, batch_size, small=True)
    model = work.model.cuda()
    batch = to_cuda(tuple(work.batch))
    state = copy.deepcopy(model.state_dict())
    reference = copy.deepcopy(model)
    torch.manual_seed(SEED)
    loss = work.loss_fn(reference(batch[0]), batch[1])
    loss.backward()
    grads = [p.grad.detach().clone() for p in reference.parameters()]
    graph = capture(model, work.loss_fn, batch)
    model.load_state_dict(state)  # capture must not have trained anything, but be sure
    return CudaWork(name, model, work.loss_fn, batch, loss.detach(), grads, state, graph)


def run_planned(work: CudaWork, planned: outcore.api.PlannedStep, device: CudaDevice,
                check: bool = True) -> StepResult:
    """One step of ``planned`` on ``device`` (sub-batches as ``Trainer.step`` runs them)."""
    from outcore.runtime.subbatch import run_sub_batches

    work.reset()
    device.reserve_host(planned.host_sizes)
    executor = Executor(planned.graph, planned.schedule, device, check=check)
    torch.manual_seed(SEED)
    parts = planned.plan.sub_batches
    if parts > 1:
        return run_sub_batches(executor, work.batch, parts)
    return executor.run(work.batch)


def grads_equal(work: CudaWork) -> list[str]:
    """Names of the parameters whose gradient differs from eager's, bit for bit."""
    named = list(work.model.named_parameters())
    return [n for (n, p), q in zip(named, work.grads, strict=True)
            if p.grad is None or not torch.equal(p.grad, q)]


def grads_close(work: CudaWork, rtol: float = 1e-4, atol: float = 1e-7) -> list[str]:
    """Names of the parameters whose gradient is off by more than ``rtol`` of the largest
    entry of eager's (other kernels or summation orders differ by rounding, element-wise
    relative errors are large only where the gradient is near zero)."""
    named = list(work.model.named_parameters())
    return [n for (n, p), q in zip(named, work.grads, strict=True)
            if p.grad is None
            or float((p.grad - q).abs().max()) > rtol * float(q.abs().max()) + atol]


class OpTemporaries(TorchDispatchMode):
    """W: the most bytes any single op held beyond its inputs and outputs while it ran (its
    in-kernel temporaries: cuDNN/cuBLAS workspaces, reduction buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.worst = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **(kwargs or {}))
        torch.cuda.synchronize()
        inside = torch.cuda.max_memory_allocated() - max(before, torch.cuda.memory_allocated())
        self.worst = max(self.worst, inside)
        return out
