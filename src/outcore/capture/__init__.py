"""Capture: the only package that traces torch.

Importing this package does not import torch (``import outcore`` imports it, and must stay
torch-free); its names load ``outcore.capture.aot`` on first use. The function
``outcore.capture(model, loss_fn, (x, y))`` is ``outcore.capture.aot.capture``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outcore.capture.aot import capture, fx_graph_of
    from outcore.capture.step import CapturedStep

__all__ = ["CapturedStep", "capture", "fx_graph_of"]


def __getattr__(name: str) -> Any:
    if name in ("capture", "fx_graph_of"):
        from outcore.capture import aot

        return getattr(aot, name)
    if name == "CapturedStep":
        from outcore.capture.step import CapturedStep

        return CapturedStep
    raise AttributeError(f"module 'outcore.capture' has no attribute {name!r}")
