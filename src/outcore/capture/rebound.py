"""Buffers the forward rebinds (``self.buf = tensor``) while a step is captured.

A captured step carries what the forward does to a buffer *in place* (``buf.add_(1)``,
BatchNorm's running statistics) into the model after every step: the traced graph returns
the buffer's new value and the executor writes it back. A forward that *rebinds* a
registered buffer (assigns a new tensor to its name: an exponential average
``self.ema = 0.9 * self.ema + 0.1 * x.mean(0)``, I-BERT's running ``x_min`` / ``x_max``,
timm ConViT's ``rel_indices`` cache) did nothing the graph could carry: the capture puts the
model's own tensors back, so every later step read the buffer's value from before the first
step, where eager reads the value the last step left (an average over 3 steps: the second
step's loss 1.348 against eager's 1.538).

While ``watching()`` is open on the capturing thread, ``nn.Module.__setattr__`` notes the
buffer each rebinding replaces (the first time per buffer) and rebinds as eager does, so the
rest of the forward reads what eager reads (the old tensor, held elsewhere, keeps its old
values). At the end of the traced step ``settle()`` (``TrainingStep.forward``) puts the
original buffer back and, when the last value has the buffer's shape, dtype and device and
needs no gradient, copies it in (under ``no_grad``): an in-place update the graph carries
like any other. The buffer object stays the one the user registered (eager's module would
hold the new object); its values are eager's after every step. A rebinding it cannot carry
so (another shape: ConViT's cache grows from its placeholder to the sequence's size; a value
that needs a gradient) leaves the buffer as it was and is listed: the capture announces it
(``announce_kept``), since after the step the module holds its old buffer.

Invariants: outside ``watching()`` (and on other threads) ``__setattr__`` is torch's; a
value is only ever copied into a buffer of its own shape, dtype and device, after the
forward; after ``settle()`` every buffer the forward rebound is the registered object again;
the original ``__setattr__`` is restored when the last open context ends, also on an
exception.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from outcore.capture.patching import SharedPatch
from outcore.errors import OutcoreWarning
from outcore.log import announce

_TORCH_SETATTR = nn.Module.__setattr__


def _install() -> None:
    nn.Module.__setattr__ = _setattr  # type: ignore[method-assign,assignment]


def _uninstall() -> None:
    nn.Module.__setattr__ = _TORCH_SETATTR  # type: ignore[method-assign]


@dataclass
class Rebinds:
    """What the forward rebound while ``watching()`` was open: ``kept``, the rebindings that
    could not be carried (``(module, buffer name)``), and ``pending``, those not settled."""

    kept: list[tuple[nn.Module, str]] = field(default_factory=list)
    #: rebound since the last ``settle``: (id(module), name) -> (module, name, buffer before)
    pending: dict[tuple[int, str], tuple[nn.Module, str, torch.Tensor]] = field(
        default_factory=dict)


_PATCH: SharedPatch[Rebinds] = SharedPatch(_install, _uninstall)


def _can_copy(old: torch.Tensor, new: torch.Tensor) -> bool:
    return (old.shape == new.shape and old.dtype == new.dtype and old.device == new.device
            and not new.requires_grad)


def _setattr(module: nn.Module, name: str, value: Any) -> None:
    """``nn.Module.__setattr__``, noting the buffer a rebinding replaces (module doc)."""
    opened = _PATCH.current()
    buffers = module.__dict__.get("_buffers")
    if opened and buffers is not None and name in buffers and isinstance(value, torch.Tensor):
        old = buffers[name]
        if isinstance(old, torch.Tensor) and old is not value:
            opened[-1].pending.setdefault((id(module), name), (module, name, old))
    _TORCH_SETATTR(module, name, value)


def settle() -> None:
    """At the end of a traced step: each buffer the forward rebound is the registered one
    again, holding the forward's last value where it can (module doc). Nothing outside
    ``watching()``."""
    opened = _PATCH.current()
    if not opened:
        return
    seen = opened[-1]
    for module, name, original in seen.pending.values():
        last = module._buffers.get(name)
        if last is original:
            continue
        module._buffers[name] = original
        if isinstance(last, torch.Tensor) and _can_copy(original, last):
            with torch.no_grad():
                original.copy_(last)
        else:
            seen.kept.append((module, name))
    seen.pending.clear()


@contextlib.contextmanager
def watching() -> Iterator[Rebinds]:
    """Turn buffer rebindings on this thread into in-place updates while open (module
    doc); yields what was rebound."""
    with _PATCH.opened(Rebinds()) as seen:
        yield seen


def announce_kept(roots: tuple[Any, ...], seen: Rebinds) -> None:
    """An ``OutcoreWarning`` naming the buffers the forward rebound in a way the step cannot
    carry (module doc), by their paths in ``roots`` (the model, the loss)."""
    if not seen.kept:
        return
    paths: dict[int, str] = {}
    for root in roots:
        if isinstance(root, nn.Module):
            for path, mod in root.named_modules():
                paths.setdefault(id(mod), path)
    names = sorted({f"{paths.get(id(mod), type(mod).__name__)}.{name}".lstrip(".")
                    for mod, name in seen.kept})
    announce(f"the forward assigns new tensors to the buffer(s) {', '.join(names[:5])} "
             "(self.buf = ...) of another shape than theirs, or needing a gradient, which "
             "the captured step cannot carry: after each step the module still holds the "
             "buffer it had before the first. Where the buffer is a cache the forward "
             "recomputes when it does not fit (timm ConViT's rel_indices), the step computes "
             "what eager computes; otherwise keep the buffer's shape and update it in place "
             "(self.buf.copy_(...)).", OutcoreWarning, stacklevel=4)
