"""Failure safety of a step: leave nothing behind when it fails, change nothing by halves.

A training step changes the user's state in one place only, its *commit*: gradients are
added to ``.grad`` and buffer updates (BatchNorm running statistics) written, after every
instruction ran and every copy completed. Before the commit nothing the user owns has been
touched, so a failure anywhere before it (device out of memory, a copy that failed, an
exception in an op, a ``KeyboardInterrupt``) leaves parameters, ``.grad`` and buffers as
they were. This module holds the two halves of that promise:

* ``abandon_step(device, exc)``: called by the executor when a step fails. It waits for
  every copy still in flight (so no copy writes into memory after the step is gone and no
  copy-engine thread is left working for it), and clears the locals of outcore's own frames
  in the exception's traceback (the generated step, the runtime, the devices), so the
  step's device tensors are freed even while the caller keeps the exception. The step's
  own exception is the one reported; a copy failure found while waiting is dropped.
* ``commit(...)``: checks every gradient and buffer update first (shapes, dtypes, layouts;
  copies made where a layout differs), then writes them all with ``SIGINT`` deferred, so a
  Ctrl-C during the writes lands after the last one instead of between two of them. The
  user's hooks on the leaves (``outcore.runtime.leaf_hooks``) run around it as autograd's
  ``AccumulateGrad`` runs them: tensor hooks on each gradient before the checks, the
  post-accumulate-grad hooks after the writes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from types import FrameType, TracebackType
from typing import Any

import torch

from outcore.errors import OutcoreError
from outcore.runtime.leaf_hooks import after_accumulate, hooked_grad

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ours(frame: FrameType) -> bool:
    name = frame.f_code.co_filename
    return name.startswith(("<outcore", _PACKAGE))


def clear_step_frames(tb: TracebackType | None) -> None:
    """Drop the locals of the finished frames in ``tb`` that hold the step's tensors: the
    generated step's and every frame it called (torch's, a variant's, the tracker's), and
    outcore's own elsewhere (runtime, devices). Frames still executing, and the caller's
    frames above the step, are left alone."""
    inside = False
    while tb is not None:
        frame = tb.tb_frame
        inside = inside or frame.f_code.co_filename.startswith("<outcore")
        if inside or _ours(frame):
            _empty_closures(frame)
            with contextlib.suppress(RuntimeError):  # a frame still executing
                frame.clear()
                frame.f_locals.clear()  # the snapshot of its locals _empty_closures read
        tb = tb.tb_next


def _empty_closures(frame: FrameType) -> None:
    """Empty the cells of generated lambdas a frame holds (``rt.save_rng(oid, lambda: ...)``):
    a cleared frame still keeps its function, and the lambda's cells keep the op's inputs."""
    for value in list(frame.f_locals.values()):
        code = getattr(value, "__code__", None)
        closure = getattr(value, "__closure__", None)
        if closure and code is not None and code.co_filename.startswith("<outcore"):
            for cell in closure:
                cell.cell_contents = None


def abandon_step(device: Any, exc: BaseException) -> None:
    """Clean up after a step that raised ``exc`` (module docstring)."""
    clear_step_frames(exc.__traceback__)
    with contextlib.suppress(Exception):  # the step's own error is the one to report
        device.synchronize()


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold back SIGINT for the block; raise ``KeyboardInterrupt`` after it if one came.

    Only the main thread receives signals, so elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
        if caught:
            raise KeyboardInterrupt


def _prepared_grad(name: str, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    if grad.shape != param.shape or grad.dtype != param.dtype:
        raise OutcoreError(f"the step's gradient of {name!r} is {tuple(grad.shape)} "
                           f"{grad.dtype}, the parameter {tuple(param.shape)} {param.dtype}")
    current = param.grad
    if current is not None:
        if current.shape != param.shape or current.dtype != grad.dtype:
            raise OutcoreError(f"{name}.grad is {tuple(current.shape)} {current.dtype}; it "
                               "cannot accumulate the step's gradient")
        return grad
    if grad.stride() == param.stride() and grad.data_ptr() != param.data_ptr():
        return grad  # used as it is, as autograd's AccumulateGrad does
    return torch.empty_like(param).copy_(grad)


def _tied_summed(params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]
                 ) -> dict[str, torch.Tensor]:
    """``grads`` with the gradients of names bound to one parameter (tied weights: an LM
    head sharing the embedding's) summed first, under the first name. Autograd sums a
    leaf's contributions before it accumulates them into ``.grad`` (``prior + (a + b)``);
    adding them to ``.grad`` one by one rounds as ``(prior + a) + b``. Autograd's engine adds
    each contribution as it arrives (``((a + b) + c)``), so with three uses or more the order
    matters: ``grads`` comes in the order the traced backward made them (the executor's
    ``_collect``), which is the engine's, and is summed in it. Then BART's and T5's shared
    embedding (four names, three uses) gets eager's gradient to the bit."""
    first: dict[int, str] = {}
    out: dict[str, torch.Tensor] = {}
    for name, g in grads.items():
        key = id(params[name])
        if key in first:
            out[first[key]] = out[first[key]] + g
        else:
            first[key] = name
            out[name] = g
    return out


def commit(params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
           buffers: Mapping[str, torch.Tensor], updates: Mapping[str, torch.Tensor]) -> None:
    """Accumulate ``grads`` into ``params[name].grad`` and copy ``updates`` into
    ``buffers[name]``, all or nothing (module docstring)."""
    with torch.no_grad():
        ready = {name: _prepared_grad(name, params[name], hooked_grad(name, params[name], g))
                 for name, g in _tied_summed(params, grads).items()}
        for name, value in updates.items():
            if buffers[name].shape != value.shape:
                raise OutcoreError(f"buffer {name!r} is {tuple(buffers[name].shape)}, its "
                                   f"update {tuple(value.shape)}")
        with deferred_interrupt():
            for name, grad in ready.items():
                param = params[name]
                if param.grad is not None:
                    param.grad.add_(grad)
                else:
                    param.grad = grad
            for name, value in updates.items():
                buffers[name].copy_(value)
        after_accumulate(params[name] for name in ready)
