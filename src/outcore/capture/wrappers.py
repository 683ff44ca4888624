"""Modules that wrap another one for a runtime outcore replaces, refused before tracing.

outcore traces a model's Python forward into one ATen graph and runs that graph itself, so
a module that hands its forward to another runtime cannot be traced; before this check each
failed deep inside tracing with a message about something else (an ``OrderedDictWrapper``
without ``clear``, a profiler node, ``FunctionalTensor``):

* ``torch.jit.script`` / ``torch.jit.trace`` modules (TorchScript runs them);
* ``torch.compile``'d modules (dynamo's ``OptimizedModule``; compiling is outcore's job
  here: ``torch.compile(model, backend=outcore.backend(...))`` plans a compiled model);
* ``nn.DataParallel`` and ``DistributedDataParallel`` (they replicate or reduce around the
  module: ``outcore.compile(..., distributed=...)`` is outcore's data parallel).

``check_wrappers`` raises ``CaptureError`` naming each such module with what to pass
instead. ``check_initialized`` likewise refuses a lazy module (``nn.LazyLinear``,
``nn.LazyConv2d``, ...) whose parameters are not yet materialised: PyTorch asks for one dry
run before an optimizer is built on them, and outcore does not run one itself (its forward
would draw random numbers and update BatchNorm statistics the user did not ask for).
Invariant: both read the module tree only.
"""

from __future__ import annotations

import torch
from torch import nn

from outcore.errors import CaptureError


def _what_instead(module: nn.Module) -> str | None:
    """The advice for a wrapping module, or None for a plain one."""
    if isinstance(module, torch.jit.ScriptModule):
        return ("a TorchScript module (torch.jit.script / torch.jit.trace): pass the Python "
                "module it was made from")
    if type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod"):
        return ("a torch.compile'd module: pass its ._orig_mod (to plan a compiled model, use "
                "torch.compile(model, backend=outcore.backend(...)))")
    if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return (f"a {type(module).__name__} wrapper: pass its .module (outcore's data "
                "parallel is outcore.compile(..., distributed=...))")
    return None


def check_wrappers(model: nn.Module) -> None:
    """Raise CaptureError when ``model`` is or holds a module outcore cannot trace into."""
    found: list[str] = []
    for name, module in model.named_modules():
        advice = _what_instead(module)
        if advice is not None:
            found.append(f"{f'submodule {name!r}' if name else 'the model'} is {advice}")
    if found:
        raise CaptureError("outcore traces the model's Python forward and cannot trace into "
                           "a module that runs elsewhere: " + "; ".join(found) + ".")


def check_initialized(model: nn.Module) -> None:
    """Raise CaptureError naming the lazy modules of ``model`` whose parameters or buffers
    are still uninitialised (``torch.nn.parameter.is_lazy``), with what to run first."""
    from torch.nn.parameter import is_lazy

    found = [f"{repr(name) if name else 'the model'} ({type(module).__name__})"
             for name, module in model.named_modules()
             if any(is_lazy(t) for t in (*module.parameters(recurse=False),
                                         *module.buffers(recurse=False)))]
    if found:
        raise CaptureError(
            "these lazy modules have uninitialised parameters: " + ", ".join(found) + ". Run "
            "the model once on an example input first (with torch.no_grad(): model(x)), as "
            "PyTorch asks before building an optimizer on them, then compile or capture it.")
