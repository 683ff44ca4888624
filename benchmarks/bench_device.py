"""Where ``vs_pytorch.py`` runs its steps: this CPU (the default) or a CUDA GPU (``--device cuda``).

One ``Target`` holds what differs between the two, so the benchmark's code reads the same:

* the profile outcore plans with (``"this-cpu"``: this machine measured; on a GPU the
  catalogue's profile of ``torch.cuda.get_device_name()``, ``outcore.hardware``);
* the device outcore's executor runs on (the plain CPU device; ``CudaDevice``, made once);
* the step peak: the CPU allocator's events (``allocator_peak``, which can leave the
  gradients out) or CUDA's caching allocator over the step (``cuda_allocator_peak``:
  ``max_memory_allocated`` less what was allocated at the start; it keeps no per-allocation
  log, so the activation peak is the step peak less the bytes of every gradient, a lower
  estimate);
* the clock: on a GPU each timed step is bracketed by ``torch.cuda.synchronize()``, so the
  time is the GPU's work, not the host's queueing of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from outcore.runtime.devices.allocator_peak import allocator_peak, cuda_allocator_peak


@dataclass
class Target:
    """The device the benchmark's steps run on (module docstring)."""

    kind: str = "cpu"
    gpu: str = "this-cpu"
    _device: list[Any] = field(default_factory=list)

    @classmethod
    def of(cls, kind: str) -> Target:
        if kind == "cpu":
            return cls()
        if not torch.cuda.is_available():
            raise SystemExit(f"--device cuda: torch {torch.__version__} sees no CUDA GPU")
        from outcore.hardware import detect_cuda_profile

        return cls("cuda", detect_cuda_profile() or "h100")

    @property
    def cuda(self) -> bool:
        return self.kind == "cuda"

    def executor_device(self) -> Any:
        """The device outcore's executor runs on (None: the executor's own CPU device)."""
        if not self.cuda:
            return None
        if not self._device:
            from outcore.runtime.devices.cuda import CudaDevice

            self._device.append(CudaDevice())
        return self._device[0]

    def move(self, model: nn.Module, batch: Any) -> tuple[nn.Module, Any]:
        """The workload's model and batch on this device."""
        if not self.cuda:
            return model, batch
        return model.cuda(), tuple(b.cuda() for b in batch)

    def step_peaks(self, step: Callable[[], Any], model: nn.Module,
                   zero_grad: Callable[[nn.Module], None]) -> tuple[int, int]:
        """(activation peak, step peak) of one run of ``step`` (module docstring)."""
        grads = [p for p in model.parameters() if p.requires_grad]
        if not self.cuda:
            whole = allocator_peak(step).peak
            zero_grad(model)
            return allocator_peak(step, lambda: [p.grad for p in grads]).peak, whole
        whole = cuda_allocator_peak(step).peak
        grad_bytes = sum(p.numel() * p.element_size() for p in grads)
        return max(0, whole - grad_bytes), whole

    def measured_cost(self, graph: Any, batch: Any, repeats: int = 5) -> Any:
        """``measured_cost`` of ``graph`` on this device, copies priced at the link of this
        target's catalogue profile."""
        from outcore.cost.profiles import get_profile

        return measured_cost(graph, batch, get_profile(self.gpu), repeats)

    def timed(self, step: Callable[[], Any]) -> float:
        """Seconds one run of ``step`` takes (on a GPU, until its kernels have finished)."""
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0


def measured_cost(graph: Any, batch: Any, link: Any, repeats: int = 5) -> Any:
    """A ``MeasuredProfile`` of ``graph``: each op's seconds inside a real step
    (``outcore.cost.measure_ops``; CUDA events on a GPU), copies priced at the link of the
    hardware profile ``link``. Plans made with it (``outcore.plan(..., cost=...)``) price
    compute as the device runs it, not as the roofline guesses."""
    from outcore.cost.measure_ops import measure_ops

    ops = measure_ops(graph, batch, repeats=repeats, warmup=2, device=link.name)
    return ops.with_link(link.h2d_bandwidth, link.d2h_bandwidth,
                         copy_engines=link.copy_engines)


#: Sizes for a GPU (``--large``): big enough that kernels, not the host's launches, set the
#: step time on a datacentre GPU.
LARGE = {
    "gpt": {"seq_len": 1024, "n_layer": 4, "n_head": 16, "d_model": 1024, "batch": 8},
    "resnet18": {"image_size": 224, "batch": 64},
    "hf-gpt2": {"n_embd": 768, "n_layer": 6, "n_head": 12, "seq": 1024, "batch": 8},
}
