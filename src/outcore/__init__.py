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
    inductor_backend(budget=...) -> a torch.compile backend: outcore's recompute plan,
        Inductor's fused kernels (``outcore.compiled``)
    policies() -> list of policy names
    zoo: the papers' networks (zoo.names(), zoo.get(name, batch))
    errors: CaptureError, InfeasibleBudgetError, ScheduleError, DeviceOutOfMemory

``capture``, ``plan`` and ``policies`` are plain functions. The subpackages of the same
names (``outcore.capture``, ``outcore.plan``, ``outcore.policies``) are imported before
the functions are bound, so their modules are reached by import statements
(``from outcore.plan.lower import lower``), never as attributes of these functions.
``import outcore`` does not import torch: ``compile``, ``backend`` and ``zoo`` load on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import outcore.capture as _capture_package  # noqa: F401  (torch-free; binds the name first)
import outcore.plan as _plan_package  # noqa: F401
import outcore.policies as _policies_package  # noqa: F401
from outcore.errors import (
    CaptureError,
    DeviceOutOfMemory,
    GraphError,
    InfeasibleBudgetError,
    OutcoreError,
    ProfileError,
    ScheduleError,
)
from outcore.graph.ir import Graph
from outcore.planned import PlannedStep, plan, policies
from outcore.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

    from outcore import zoo
    from outcore.compile_backend import backend
    from outcore.compiled import inductor_backend
    from outcore.compiling import compile

__version__ = "0.1.0"

__all__ = [
    "CaptureError", "DeviceOutOfMemory", "GraphError", "InfeasibleBudgetError", "OutcoreError",
    "PlannedStep", "ProfileError", "ScheduleError", "backend", "capture", "compile",
    "format_bytes", "inductor_backend", "parse_bytes", "plan", "policies", "zoo",
]


def capture(model: Any, loss_fn: Callable[..., Any] | None, example_batch: Any, *,
            fake: bool = False, name: str | None = None, autocast: Any = None,
            outputs: bool = False) -> Graph:
    """Capture one whole training step of ``model`` as a Graph (imports torch).

    ``loss_fn(model(x), y)`` is traced forward and backward (a dict batch calls
    ``model(**batch)``; ``loss_fn=None`` reads the loss the model returns); ``fake=True``
    traces with fake tensors (nothing large is allocated); ``autocast``: torch.bfloat16 or
    torch.float16; ``outputs``: keep what the model returns as outputs of the step. See
    ``outcore.capture.aot.capture``.
    """
    from outcore.capture.aot import capture as capture_step

    return capture_step(model, loss_fn, example_batch, fake=fake, name=name, autocast=autocast,
                        outputs=outputs)


def __getattr__(name: str) -> Any:  # lazy: `import outcore` does not import torch
    if name == "compile":
        from outcore.compiling import compile

        return compile
    if name == "backend":
        from outcore.compile_backend import backend

        return backend
    if name == "inductor_backend":
        from outcore.compiled import inductor_backend

        return inductor_backend
    if name in ("zoo", "reproduce", "errors", "hardware", "plan_cache", "progress"):
        import importlib

        return importlib.import_module(f"outcore.{name}")
    raise AttributeError(f"module 'outcore' has no attribute {name!r}")
