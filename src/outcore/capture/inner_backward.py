"""A step whose backward calls ``backward()`` itself: refused with its reason, ``.grad`` kept.

Reversible layers (Reformer's ``_ReversibleFunction``, RevNets) are a custom
``torch.autograd.Function`` whose backward recomputes a layer under ``enable_grad`` and
calls ``.backward()`` on it, so the layer's parameters get their gradients by accumulation
into ``.grad`` (a side effect), not as gradients the Function returns. outcore captures a
step as one traced graph whose outputs are the gradients; when the trace runs such a
backward, the accumulation lands on the live parameters as traced tensors: a
``FunctionalTensor`` was left in ``p.grad`` where it had been None (the model damaged for
eager training after a refused capture), and where ``.grad`` held a tensor, functionalization
asserted ("mutating a non-functional tensor with a functional tensor").

``watching(named)`` wraps a capture: it counts the calls of ``torch.autograd.backward``
(``Tensor.backward`` calls it) that the capturing thread makes while the step is traced,
with the user's frame that made each, puts every watched tensor's ``.grad`` back as it was
when the block ends, and raises ``CaptureError`` naming the call and the tensors when the
traced step changed a watched ``.grad`` or failed after such a call. A backward that only
reads its own local leaves' ``.grad`` (``x.detach().requires_grad_()``, then ``x.grad``), or
computes with ``torch.autograd.grad`` (no accumulation: traced like any op), is captured as
before.

Invariant: after the block, each watched tensor's ``.grad`` is the object it was before it
(a tensor changed in place inside it is reported; no capture is let through that changed one).
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from outcore.errors import CaptureError

_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _user_frame() -> str:
    """``file:line in function`` of the innermost frame outside torch and outcore."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith((_TORCH, _OURS)):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "an unknown place"


@contextlib.contextmanager
def watching(named: Sequence[tuple[str, torch.Tensor]]) -> Iterator[None]:
    """Around a capture of a step reading ``named`` leaves (module doc)."""
    kept = [(name, t, t.grad, None if t.grad is None else t.grad._version) for name, t in named]
    calls: list[str] = []
    original = torch.autograd.backward
    tracing = threading.get_ident()  # another thread's backward is not the step's

    def backward(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == tracing:
            calls.append(_user_frame())
        return original(*args, **kwargs)

    torch.autograd.backward = backward
    failed: BaseException | None = None
    try:
        yield
    except BaseException as exc:  # noqa: BLE001 - re-raised below, or the reason instead
        failed = exc
    finally:
        torch.autograd.backward = original
        changed = []
        for name, tensor, grad, version in kept:
            if tensor.grad is not grad or (grad is not None and grad._version != version):
                changed.append(name)
                tensor.grad = grad
    if calls and (changed or failed is not None):
        raise _refusal(calls, changed) from failed
    if changed:  # a .grad written by other means than backward(): never let through
        raise _refusal(calls, changed)
    if failed is not None:
        raise failed


def _refusal(calls: list[str], changed: list[str]) -> CaptureError:
    where = f"backward() called at {calls[0]}" if calls else "a .grad written while traced"
    touched = (f"; it would set .grad of {', '.join(changed[:5])}"
               f"{' and more' if len(changed) > 5 else ''}" if changed else "")
    return CaptureError(
        f"the step's backward runs a backward of its own ({where}{touched}): a custom "
        "autograd.Function whose backward recomputes layers and calls .backward() on them, "
        "as reversible layers do (Reformer, RevNets), gives the parameters their gradients "
        "by accumulating into .grad, which a captured step (one traced graph whose outputs "
        "are the gradients) cannot see. .grad is left as it was. Train such a model without "
        "its reversible layers (a configuration with plain residual layers), or pass the "
        "layer's parameters to the Function as inputs and return their gradients, computed "
        "with torch.autograd.grad, from its backward.")
