"""outcore: train PyTorch networks whose training memory exceeds the accelerator's.

outcore captures one training step as a dataflow graph, plans for every activation whether
to keep it, offload it to host memory and prefetch it back, or recompute it, and runs that
plan with copies overlapped with compute, on CUDA or on a CPU-emulated accelerator.

Public API:
    capture(model, loss_fn, (x, y), fake=False) -> Graph
    plan(graph, budget, policy="auto", gpu=None) -> PlannedStep
    compile(model, loss_fn, (x, y), budget="6GiB", device="cuda", gpu=None, policy="auto")
        -> Trainer with .step(x, y), .plan, .explain(), .stats
    backend(budget=...) -> a torch.compile backend
    policies() -> list of policy names
    errors: CaptureError, InfeasibleBudgetError, ScheduleError, DeviceOutOfMemory
"""

from outcore import plan, policies  # callable subpackages: plan(...), policies()
from outcore.errors import (
    CaptureError,
    DeviceOutOfMemory,
    GraphError,
    InfeasibleBudgetError,
    OutcoreError,
    ProfileError,
    ScheduleError,
)
from outcore.units import format_bytes, parse_bytes

__version__ = "0.1.0"

__all__ = [
    "CaptureError", "DeviceOutOfMemory", "GraphError", "InfeasibleBudgetError", "OutcoreError",
    "ProfileError", "ScheduleError", "backend", "capture", "compile", "format_bytes",
    "parse_bytes", "plan", "policies",
]


def __getattr__(name: str):  # lazy: `import outcore` does not import torch
    if name == "capture":  # the callable subpackage (imports torch)
        import outcore.capture

        return outcore.capture
    if name == "compile":
        from outcore.trainer import compile

        return compile
    if name == "backend":
        from outcore.compile_backend import backend

        return backend
    raise AttributeError(f"module 'outcore' has no attribute {name!r}")
